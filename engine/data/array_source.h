/* array_source.h - arrays in a file as a batch source: .npy, .npz and safetensors.
 *
 * Every array of the file is one field of the source (engine/data/batch_source.h). Its first
 * dim is the sample dim and the rest is the shape of one sample's value; all arrays must agree
 * on the sample count N (features and labels of the same samples). The format is recognised
 * by content (the magic bytes), not by the file's extension:
 *  - .npy (starts "\x93NUMPY", versions 1.0, 2.0 and 3.0): one array, the field named
 *    opts->npy_name (default "x");
 *  - .npz (a zip archive, as np.savez and np.savez_compressed write it, stored or deflated):
 *    one field per member, named by the member's name without ".npy", in archive order;
 *  - safetensors (an 8-byte header length, then '{'): one field per tensor, in data order.
 *
 * Element types: float32; float64, float16 and bfloat16 (converted to float32); int8, uint8,
 * int16, int32, int64 and bool, whose fields are whole numbers (field.integer) and must lie
 * within 2^24 in magnitude so that fp32 holds them exactly (checked at open: the error names
 * the file, the field, the sample and the value). Anything else (complex, object, strings,
 * structured, big-endian, unsigned 16/32/64, fp8) is refused naming the dtype.
 *
 * Splits: with val_fraction v in [0, 1), the last floor(N * v) samples (in file order) are
 * the validation split and the rest the training split (MS_SPLIT_ALL is all N); the training
 * split must not be empty.
 *
 * Batches, for a split of N samples (s_0 .. s_{N-1} in file order):
 *  - sampled (training) batch i of B rows: row r is draw d = i*B + r; its epoch is e = d / N
 *    and its position p = d % N; the row holds sample s_{perm_e(p)}, where perm_e is a
 *    permutation of 0..N-1 keyed by (seed, MS_ARRAY_STREAM_BASE + split, e): a balanced
 *    Feistel network of 6 Philox-driven rounds over the smallest even power of two >= N, with
 *    cycle walking down to [0, N). So every sample appears exactly once per epoch, a row costs
 *    O(1) (no O(N) shuffle), and batch i is a pure function of (seed, i, B, the file); rows
 *    [r0, r0 + nrows) equal those rows of the whole batch, so data-parallel shards of any
 *    degree concatenate to the same global batch, and a run resumed at step i reads what an
 *    uninterrupted one would have.
 *  - evaluation batch i of B rows: samples i*B .. i*B + B-1 of the split in file order; a
 *    batch that does not fit in the split is an error naming the batch, the split and its
 *    sample count.
 *
 * Memory: the file is mapped read-only once at open (.npy, safetensors) or each .npz member
 * is decompressed once at open (through libzip); rows are converted to fp32 on demand. A
 * mapped file must not be truncated while the source is open (the pages past its new end
 * would fault); replace data files by renaming a new one over them.
 *
 * Errors: a bad file gives one line naming the file and the problem: MS_ERR_IO for the file
 * system (missing, unreadable, not a regular file), MS_ERR_INVALID for content (truncated,
 * unknown format, unsupported dtype, fortran_order, sizes that overflow or exceed the file,
 * zero samples, sample counts that differ, too many fields, names too long, 0-d arrays,
 * integers beyond 2^24). Shapes and sizes are checked before anything is allocated.
 */
#ifndef MS_ARRAY_SOURCE_H
#define MS_ARRAY_SOURCE_H

#include "engine/core/status.h"
#include "engine/data/batch_source.h"

/* The Philox stream of the array sources' epoch permutations (plus the split); distinct from
 * MS_DATA_STREAM_BASE, so the text sampler's and these draws never coincide. */
#define MS_ARRAY_STREAM_BASE 0x6d73617272617900ull /* "msarray\0" */

typedef struct ms_array_source_opts {
    double val_fraction;  /* in [0, 1): the last floor(N * val_fraction) samples validate */
    const char *npy_name; /* the field of a .npy file; NULL is "x" */
} ms_array_source_opts;

/* Opens `path` (opts may be NULL: no validation split, npy field "x"). On success the caller
 * owns *out and releases it with ms_batch_source_close; on failure *out is NULL. */
ms_status ms_array_source_open(const char *path, const ms_array_source_opts *opts,
                               ms_batch_source **out, ms_error *err);

/* The position in [0, n) that position p of epoch `epoch`'s permutation holds (see above);
 * exposed for tests. */
uint64_t ms_array_perm(uint64_t seed, uint64_t stream, uint64_t epoch, uint64_t n, uint64_t p);

#endif

/* safetensors.h - single-file safetensors checkpoints: durable writer, validating reader.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, name: {"dtype": "F32"|"BF16", "shape": [...],
 *    "data_offsets": [begin, end)}, ...}
 * padded with spaces so the data starts 8-byte aligned, then the data section. The writer
 * lays tensors out contiguously in the order given. The reader accepts any key order and
 * checks everything a corrupt or hostile file could get wrong: header length at most
 * 100,000,000 and inside the file, well-formed JSON, known dtypes, non-negative shapes with
 * overflow-checked sizes, offsets that tile [0, data length) with no gap or overlap, no
 * duplicate names. Every failure is an MS_ERR_INVALID (bad content) or MS_ERR_IO (the file
 * system) whose message names the file and the problem.
 */
#ifndef MS_SAFETENSORS_H
#define MS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

#define MS_ST_MAX_HEADER 100000000u

/* One tensor to write. */
typedef struct ms_st_entry {
    const char *name; /* non-empty, unique, not "__metadata__" */
    ms_dtype dtype;   /* in the file: MS_F32, or MS_BF16 (rounded to nearest even) */
    int ndim;         /* 0..MS_MAX_DIMS; 0 is a scalar */
    int64_t shape[MS_MAX_DIMS];
    const float *data; /* numel row-major floats, borrowed for the call */
} ms_st_entry;

/* A metadata string pair. */
typedef struct ms_st_kv {
    const char *key;
    const char *value;
} ms_st_kv;

/* Writes entries (and optional metadata) to `path` durably: temp file in the same folder,
 * fsync, rename, fsync of the folder. On failure an existing `path` is untouched, no temp
 * file remains, and the message names the path and the errno text. */
ms_status ms_safetensors_write(const char *path, const ms_st_entry *entries, int n,
                               const ms_st_kv *meta, int nmeta, ms_error *err);

/* One tensor as read. */
typedef struct ms_st_tensor {
    char *name;
    ms_dtype dtype;       /* as stored in the file (MS_F32 for the types below that are
                             neither F32 nor BF16: read dtype_name then) */
    char dtype_name[8];   /* the file's tag: "F32", "BF16", "I64", "U8", "BOOL", ... */
    unsigned dtype_bytes; /* bytes per element of that tag */
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* byte range inside the data section */
    float *data;         /* numel floats widened to f32; NULL when numel is 0 or after
                            ms_safetensors_parse_header alone */
} ms_st_tensor;

/* A parsed file. Everything in it is owned by it and freed by ms_safetensors_free. */
typedef struct ms_st_file {
    char *path; /* the name used in messages */
    int n;      /* tensors, in data-offset order */
    ms_st_tensor *tensors;
    int nmeta;
    char **meta_keys; /* nmeta each */
    char **meta_values;
    uint64_t header_len;    /* N */
    uint64_t data_len;      /* file size - 8 - N */
    ms_st_tensor **by_name; /* n pointers sorted by name, for lookups */
} ms_st_file;

/* Validates the header in buf (the first len bytes of a file of file_size bytes; len must
 * cover 8 + N bytes to succeed) and fills *out with names, dtypes, shapes and offsets; no
 * tensor data. `name` stands for the file in messages. This is the fuzzing entry point.
 * On failure *out is empty (freeing it is still allowed). */
ms_status ms_safetensors_parse_header(const uint8_t *buf, size_t len, uint64_t file_size,
                                      const char *name, ms_st_file *out, ms_error *err);

/* The same, accepting every dtype tag of the format (BOOL, U8, I8, U16, I16, F16, BF16, U32,
 * I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2) rather than only F32 and BF16: for readers of
 * data files (engine/data/array_source.h), which convert what they support and refuse the
 * rest by name. An unknown tag is still an error. */
ms_status ms_safetensors_parse_header_any(const uint8_t *buf, size_t len, uint64_t file_size,
                                          const char *name, ms_st_file *out, ms_error *err);

/* Reads and validates `path` and loads every tensor as f32 copies. */
ms_status ms_safetensors_read(const char *path, ms_st_file *out, ms_error *err);

/* Frees everything in f and zeroes it; safe on a zeroed struct and twice. */
void ms_safetensors_free(ms_st_file *f);

/* The tensor or metadata value with that name, or NULL. Borrowed from f. */
const ms_st_tensor *ms_safetensors_find(const ms_st_file *f, const char *name);
const char *ms_safetensors_meta(const ms_st_file *f, const char *key);

/* What a model expects to find in a checkpoint. */
typedef struct ms_st_expect {
    const char *name;
    int ndim;
    int64_t shape[MS_MAX_DIMS];
} ms_st_expect;

/* Checks f against the model's list: reports (MS_ERR_INVALID) the first expected name that
 * is missing or has another shape, in the order of `want`, then the first name in the file
 * that the model does not expect, e.g. "checkpoint x.safetensors: h.0.attn.c_attn.weight has
 * shape [768, 2304], the model expects [768, 1536]". */
ms_status ms_safetensors_check(const ms_st_file *f, const ms_st_expect *want, int n, ms_error *err);

#endif

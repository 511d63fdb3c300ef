/* checkpoint_internal.h - what the checkpoint writer and reader share: the piece plan, the
 * metadata file, file checksums and box copies (private to engine/train/checkpoint_*.c). */
#ifndef MS_CHECKPOINT_INTERNAL_H
#define MS_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/train/checkpoint.h"

#define CKPT_FORMAT   "meshscope-checkpoint"
#define CKPT_VERSION  1
#define CKPT_KINDS    4 /* the ms_state_kind values a checkpoint may hold */
#define CKPT_KEY_MAX  320
#define CKPT_META_MAX (64u << 20)

/* One box of one state tensor, written by one rank under one key of its file. */
typedef struct ckpt_piece {
    int writer; /* world rank (the file rank-WRITER.safetensors) */
    char key[CKPT_KEY_MAX];
    int64_t start[MS_MAX_DIMS], shape[MS_MAX_DIMS];
} ckpt_piece;

/* One state tensor (a parameter or a moment) and the pieces that tile it. */
typedef struct ckpt_tensor {
    char *name;
    ms_state_kind kind;
    ms_dtype dtype; /* as its pieces are stored in the files */
    ms_shape gshape;
    ckpt_piece *pieces;
    int np;
    int state_index; /* saving: the trainer's state index of the first holder */
} ckpt_tensor;

typedef struct ckpt_file {
    int rank;
    uint64_t bytes;
    uint32_t crc;
} ckpt_file;

/* A checkpoint as meta.json describes it (reading), or as the writer plans it (saving). */
typedef struct ckpt_meta {
    ms_ckpt_info info;
    ckpt_tensor *t;
    int nt;
    ckpt_file *files;
    int nfiles;
} ckpt_meta;

/* "param", "exp_avg", "exp_avg_sq", "buffer" */
const char *ckpt_kind_name(ms_state_kind k);

/* The pieces of t's state: every (name, kind) once (its first holder), each distinct box
 * once, written by the first rank of the mesh that holds it. The same on every rank. */
void ckpt_plan(ms_trainer *t, ckpt_meta *out);
void ckpt_meta_free(ckpt_meta *m);

/* meta.json: written by rank 0 at commit, read by every loader. Reading checks everything a
 * loader relies on before any file is opened: fields in range, sizes that fit int64, pieces
 * that tile each tensor exactly (each inside its shape, no overlap, no gap), the pieces of a
 * file fitting in its size, no tensor or file twice. On failure *m is empty. */
ms_status ckpt_meta_write(const char *path, const ckpt_meta *m, ms_error *err);
ms_status ckpt_meta_read(const char *step_dir, ckpt_meta *m, ms_error *err);
/* The same over meta.json's text[0..len) (name stands for the file in messages; the fuzzing
 * entry point, tests/fuzz/fuzz_ckpt_meta.c). */
ms_status ckpt_meta_parse(const char *text, size_t len, const char *name, ckpt_meta *m,
                          ms_error *err);
/* The step folder of `dir`: dir/<latest> if dir has a `latest` file, else dir itself if it
 * holds meta.json. */
ms_status ckpt_resolve(const char *dir, char *step_dir, size_t len, ms_error *err);

/* Size and CRC-32 of a file (a regular one: a FIFO or a device is refused, never read). */
ms_status ckpt_file_sum(const char *path, uint64_t *bytes, uint32_t *crc, ms_error *err);
/* Checks file f of m (a regular file, its size, then its CRC) in step_dir. */
ms_status ckpt_file_check(const char *step_dir, const ckpt_file *f, ms_error *err);
/* Checks that every file of m is a regular file of the size meta.json gives (no CRC: cheap),
 * before memory is sized by what meta.json says the files hold. */
ms_status ckpt_files_sized(const char *step_dir, const ckpt_meta *m, ms_error *err);
void ckpt_file_name(int rank, char *out, size_t len); /* rank-00003.safetensors */

/* Copies the overlap of box `src` (start, shape; row-major data) into box `dst`; returns
 * the elements copied. */
int64_t ckpt_copy_overlap(int ndim, const int64_t *src_start, const int64_t *src_shape,
                          const float *src, const int64_t *dst_start, const int64_t *dst_shape,
                          float *dst);

#endif

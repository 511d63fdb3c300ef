/* checkpoint.h - distributed checkpoints of a training run: save in the background, resume
 * under any strategy and world size.
 *
 * A checkpoint folder holds complete checkpoints step-NNNNNNNN/ and a `latest` file naming
 * the newest. Each checkpoint has one safetensors file per rank that writes anything
 * (rank-NNNNN.safetensors: that rank's boxes of the state, ms_trainer_state) and meta.json,
 * which maps every state tensor (parameters, both AdamW moments and the buffers: batch
 * norm's running statistics, kind "buffer") to its global shape and
 * to the pieces that tile it: file, key, box start and shape. A box that several ranks hold
 * (replicated over dp, say) is written once, by the first of them. meta.json also holds the
 * step to run next, the strategy, the training options that decide the data order and masks
 * (seed, batch, seq) and every file's size and CRC-32.
 *
 * Saving is atomic: the ranks write into .tmp-step-NNNNNNNN/, rank 0 then writes meta.json,
 * renames the folder, replaces `latest` (temporary file, fsync, rename, fsync of the folder)
 * and removes checkpoints beyond the newest `keep`. A crash at any point leaves the previous
 * checkpoint loadable. Saving is asynchronous: at the step boundary each rank copies its
 * boxes into host buffers (the step's only stall) and a background thread writes them; the
 * commit happens at the first later step boundary at which every rank's writer is done.
 *
 * Loading reads, for every box this rank holds under the trainer's (any) strategy, the
 * pieces that overlap it. Everything is checked before anything is loaded: sizes and CRCs of
 * the files read, names and shapes against the model, full coverage of every box; a failure
 * on any rank fails every rank and leaves every trainer unchanged.
 */
#ifndef MS_CHECKPOINT_H
#define MS_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/core/xalloc.h"
#include "engine/train/trainer.h"

typedef struct ms_ckpt_opts {
    const char *dir;   /* the checkpoint folder (created if missing) */
    int keep;          /* complete checkpoints kept, newest first; <= 0: 3 */
    const char *model; /* the model's config path or name, recorded; may be NULL */
} ms_ckpt_opts;

/* One rank's saver: owns its background writer thread and the host buffer of its copies. */
typedef struct ms_ckpt_saver ms_ckpt_saver;

/* Collective: every rank of the world. Checks that the folder can be written (creating it),
 * and rank 0 removes temporary folders that a killed save left, before any rank returns;
 * fails on every rank when one cannot write. Copies the options' strings. */
ms_status ms_ckpt_saver_create(ms_ctx *ctx, const ms_ckpt_opts *o, ms_ckpt_saver **out,
                               ms_error *err);
/* Sizes and touches this rank's host buffer for t's state (once, before the first step), so
 * that no save stalls on fresh memory. Optional; not collective. */
void ms_ckpt_saver_prepare(ms_ckpt_saver *s, ms_trainer *t);
/* Every rank, at the same step boundary: finishes a save still in flight (waiting for it;
 * what its commit has to say is kept for the next poll), then copies this rank's boxes of
 * t's state into host buffers and hands them to the writer. meta.json records the strategy t
 * runs now (after a switch, the new one). *stall_s receives the time the step stood still
 * (waiting plus copying). */
ms_status ms_ckpt_saver_save(ms_ckpt_saver *s, ms_trainer *t, double *stall_s, ms_error *err);
/* Every rank, at every step boundary while a save is in flight (a no-op otherwise), and with
 * wait = true at the end of the run: when every rank's writer is done, rank 0 commits the
 * checkpoint (with wait, every rank returns only after that commit, so a load that follows
 * finds it). Collective over the world while a save is in flight. A save that could not be
 * written (a full disk, a read-only folder) is abandoned: the previous checkpoint stays, the
 * run goes on, and *note (if not NULL) tells why (rank 0: what happened; every rank: its own
 * failure); *note is empty when there is nothing to say. Every save is reported once: *note
 * also holds what a save's own wait (ms_ckpt_saver_save) committed or abandoned since the last
 * poll, one line per checkpoint, oldest first. Fails only if the world does. */
ms_status ms_ckpt_saver_poll(ms_ckpt_saver *s, bool wait, char *note, size_t note_len,
                             ms_error *err);
/* Waits for the writer and frees everything (not collective: an in-flight save that was not
 * polled to its end is left uncommitted, so `latest` still names the previous one). */
void ms_ckpt_saver_destroy(ms_ckpt_saver *s);

/* What a checkpoint says of itself. */
typedef struct ms_ckpt_info {
    char path[1024];    /* the step folder read */
    int64_t step;       /* the step a resumed run runs first */
    int64_t skipped;    /* steps skipped for non-finite values before it */
    int world;          /* ranks that saved it */
    char strategy[512]; /* the strategy JSON it was saved under */
    char model[256];
    uint64_t seed;
    int batch, seq, steps;
} ms_ckpt_info;

/* Every rank: loads the checkpoint in `dir` (a checkpoint folder with `latest`, or one
 * step-NNNNNNNN folder) into t, whatever t's strategy and world size, and sets t's step.
 * Refuses, leaving t unchanged, a checkpoint of another model or data order (seed, batch,
 * seq), with missing, truncated or corrupt files, or that does not cover every box. */
ms_status ms_ckpt_load(ms_trainer *t, const char *dir, ms_ckpt_info *info, ms_error *err);

/* Reads a checkpoint's meta.json (no tensor data): info and a readable summary appended to
 * `text` (may be NULL): tensors and bytes by kind, files with sizes. */
ms_status ms_ckpt_describe(const char *dir, ms_ckpt_info *info, ms_strbuf *text, ms_error *err);

/* Whether the checkpoint in `dir` (resolved as ms_ckpt_load does) is intact: its meta.json
 * reads, and every file it lists is there with the size and CRC-32 it records (the loader's
 * own checks, without a model). On success, info (may be NULL) as ms_ckpt_describe gives it;
 * otherwise the reason, naming the file. */
ms_status ms_ckpt_verify(const char *dir, ms_ckpt_info *info, ms_error *err);

/* The newest checkpoint of the checkpoint folder `dir` that verifies (ms_ckpt_verify), by
 * step, whatever `latest` names: info->path is its step folder. Each newer one that did not
 * verify is appended to `skipped` (may be NULL) as a line with its reason. Fails with
 * MS_ERR_IO when no checkpoint there verifies (none yet, or all damaged). */
ms_status ms_ckpt_newest_intact(const char *dir, ms_ckpt_info *info, ms_strbuf *skipped,
                                ms_error *err);

/* Writes the parameters and buffers of the checkpoint in `dir`, each assembled whole, as one
 * Hugging Face safetensors file (what `train --save` writes). Checks sizes and CRCs first. */
ms_status ms_ckpt_export(const char *dir, const char *out_path, int *n_tensors, ms_error *err);

#endif

/* batch_source.c - the generic source calls and the text source (batch_source.h). */
#include "engine/data/batch_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

int64_t ms_batch_field_numel(const ms_batch_field *f) {
    int64_t n = 1;
    for (int i = 0; i < f->ndim; i++) n *= f->shape[i];
    return n;
}

int ms_batch_source_find(const ms_batch_source *src, const char *name) {
    for (int i = 0; i < src->nfields; i++)
        if (!strcmp(src->fields[i].name, name)) return i;
    return -1;
}

static const char *split_name(ms_split s) {
    return s == MS_SPLIT_TRAIN ? "training" : s == MS_SPLIT_VAL ? "validation" : "whole";
}

ms_status ms_batch_source_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                               uint64_t batch, int B, int r0, int nrows, float *const *out,
                               ms_error *err) {
    if (B <= 0 || r0 < 0 || nrows < 0 || r0 + nrows > B)
        return ms_fail(err, MS_ERR_INVALID, "%s: rows [%d, %d) are not within a batch of %d",
                       src->name, r0, r0 + nrows, B);
    if ((unsigned)s > MS_SPLIT_ALL || src->samples[s] == 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the %s split holds no sample; give the file more samples or "
                       "a smaller validation fraction",
                       src->name, split_name(s));
    return src->vt->read(src, s, eval, seed, batch, B, r0, nrows, out, err);
}

uint64_t ms_batch_source_eval_batches(const ms_batch_source *src, ms_split s, int B) {
    if (B <= 0 || (unsigned)s > MS_SPLIT_ALL) return 0;
    return src->samples[s] / (uint64_t)B;
}

void ms_batch_source_close(ms_batch_source *src) {
    if (!src) return;
    if (src->vt && src->vt->close) src->vt->close(src);
    free(src);
}

/* --- the text source --------------------------------------------------------------------- */

static ms_status text_read(const ms_batch_source *src, ms_split s, bool eval, uint64_t seed,
                           uint64_t batch, int B, int r0, int nrows, float *const *out,
                           ms_error *err) {
    const ms_text_data *d = src->impl;
    size_t n = (size_t)nrows * (size_t)d->seq_len;
    int32_t *ids = xmalloc(sizeof *ids * (n ? n : 1)), *tgt = xmalloc(sizeof *tgt * (n ? n : 1));
    ms_status rc = eval ? ms_text_data_eval(d, s, batch, B, r0, nrows, ids, tgt, err)
                        : ms_text_data_sample(d, s, seed, batch, B, r0, nrows, ids, tgt, err);
    if (rc == MS_OK)
        for (size_t i = 0; i < n; i++) out[0][i] = (float)ids[i], out[1][i] = (float)tgt[i];
    free(ids), free(tgt);
    return rc;
}

static const ms_batch_source_vt text_vt = {.read = text_read, .close = NULL};

/* The text source that owns its data. */
static void owned_text_close(ms_batch_source *src) {
    ms_text_data_close(src->impl);
    free(src->impl);
}

static const ms_batch_source_vt owned_text_vt = {.read = text_read, .close = owned_text_close};

ms_status ms_text_source_open(const ms_text_data *data, ms_batch_source **out, ms_error *err) {
    if (!data || !data->bytes || data->seq_len <= 0)
        return ms_fail(err, MS_ERR_INVALID, "the text source needs opened text data");
    ms_batch_source *src = xcalloc(1, sizeof *src);
    src->vt = &text_vt;
    snprintf(src->name, sizeof src->name, "%s", data->path ? data->path : "text");
    src->nfields = 2;
    const char *names[2] = {"ids", "targets"};
    for (int f = 0; f < 2; f++) {
        ms_batch_field *fd = &src->fields[f];
        snprintf(fd->name, sizeof fd->name, "%s", names[f]);
        fd->ndim = 1, fd->shape[0] = data->seq_len, fd->integer = true;
    }
    /* Sampled windows are drawn with replacement (dataset.h); the counts are the windows that
     * fit, which is what evaluation walks. */
    for (int s = 0; s <= MS_SPLIT_ALL; s++) {
        size_t begin, len;
        ms_text_data_split(data, (ms_split)s, &begin, &len);
        src->samples[s] = len / ((size_t)data->seq_len + 1);
    }
    src->impl = (void *)data;
    *out = src;
    return MS_OK;
}

ms_status ms_text_source_open_file(const char *path, int seq, double val_fraction, int vocab_size,
                                   ms_batch_source **out, ms_error *err) {
    *out = NULL;
    ms_text_data *d = xcalloc(1, sizeof *d);
    ms_status st = ms_text_data_open(path, seq, val_fraction, d, err);
    if (st == MS_OK && vocab_size > 0) st = ms_text_data_check_vocab(d, vocab_size, err);
    if (st == MS_OK) st = ms_text_source_open(d, out, err);
    if (st != MS_OK) {
        ms_text_data_close(d);
        free(d);
        return st;
    }
    (*out)->vt = &owned_text_vt;
    return MS_OK;
}

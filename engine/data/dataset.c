/* dataset.c - file splits, Philox-sampled training windows and in-order evaluation windows. */
#include "engine/data/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/philox.h"
#include "engine/core/xalloc.h"
#include "engine/data/tokenizer.h"
#include "engine/io/fileio.h"

static ms_status setup(ms_text_data *d, const char *name, int seq_len, double val_fraction,
                       ms_error *err) {
    if (seq_len < 1)
        return ms_fail(err, MS_ERR_INVALID, "%s: seq_len is %d; it must be at least 1", name,
                       seq_len);
    if (!(val_fraction >= 0 && val_fraction < 1))
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: val_fraction is %g; it must be in [0, 1) (e.g. 0.1 keeps the last "
                       "10%% of the file for validation)",
                       name, val_fraction);
    const size_t win = (size_t)seq_len + 1;
    if (d->nbytes == 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the file is empty; it needs at least one window of seq_len + 1 = %zu "
                       "bytes",
                       name, win);
    if (d->nbytes < win)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the file has %zu bytes, shorter than one window of seq_len + 1 = %zu "
                       "bytes; use a longer text or a smaller seq_len",
                       name, d->nbytes, win);
    size_t nval = (size_t)floor((double)d->nbytes * val_fraction);
    d->val_begin = d->nbytes - nval;
    d->seq_len = seq_len;
    d->val_fraction = val_fraction;
    if (d->val_begin < win)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the training split (the first %zu of %zu bytes) is shorter than one "
                       "window of seq_len + 1 = %zu bytes; lower val_fraction (%g), use a smaller "
                       "seq_len or a longer text",
                       name, d->val_begin, d->nbytes, win, val_fraction);
    if (nval > 0 && nval < win)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the validation split (the last %zu bytes, val_fraction %g) is shorter "
                       "than one window of seq_len + 1 = %zu bytes; raise val_fraction, use a "
                       "smaller seq_len or a longer text (or val_fraction 0 for no validation)",
                       name, nval, val_fraction, win);
    return MS_OK;
}

ms_status ms_text_data_open(const char *path, int seq_len, double val_fraction, ms_text_data *d,
                            ms_error *err) {
    memset(d, 0, sizeof *d);
    ms_status st = ms_read_file(path, SIZE_MAX / 2, &d->bytes, &d->nbytes, err);
    if (st != MS_OK) {
        if (st == MS_ERR_IO)
            ms_fail_wrap(err, st,
                         "training data (the default data/kjv.txt is made by "
                         "scripts/prepare-data.sh)");
        return st;
    }
    d->path = xstrdup(path);
    st = setup(d, path, seq_len, val_fraction, err);
    if (st != MS_OK) ms_text_data_close(d);
    return st;
}

ms_status ms_text_data_from_bytes(const char *name, const uint8_t *bytes, size_t n, int seq_len,
                                  double val_fraction, ms_text_data *d, ms_error *err) {
    memset(d, 0, sizeof *d);
    if (!name) name = "<memory>";
    d->bytes = xmalloc(n ? n : 1);
    if (n) memcpy(d->bytes, bytes, n);
    d->nbytes = n;
    d->path = xstrdup(name);
    ms_status st = setup(d, name, seq_len, val_fraction, err);
    if (st != MS_OK) ms_text_data_close(d);
    return st;
}

ms_status ms_text_data_check_vocab(const ms_text_data *d, int vocab_size, ms_error *err) {
    if (vocab_size >= MS_BYTE_VOCAB) return MS_OK;
    size_t first = d->nbytes;
    int top = -1;
    for (size_t i = 0; i < d->nbytes; i++) {
        if (d->bytes[i] >= vocab_size && first == d->nbytes) first = i;
        if (d->bytes[i] > top) top = d->bytes[i];
    }
    if (first == d->nbytes) return MS_OK;
    return ms_fail(err, MS_ERR_INVALID,
                   "%s: byte %d at offset %zu is token %d, outside the model's vocabulary of %d "
                   "tokens (each byte is its own token); this data needs vocab_size %d or more: "
                   "set \"vocab_size\" in the model config to %d, or to 256, which covers any "
                   "file",
                   d->path, d->bytes[first], first, d->bytes[first], vocab_size, top + 1, top + 1);
}

void ms_text_data_close(ms_text_data *d) {
    if (!d) return;
    free(d->bytes);
    free(d->path);
    memset(d, 0, sizeof *d);
}

void ms_text_data_split(const ms_text_data *d, ms_split s, size_t *begin, size_t *len) {
    switch (s) {
        case MS_SPLIT_TRAIN:
            *begin = 0;
            *len = d->val_begin;
            break;
        case MS_SPLIT_VAL:
            *begin = d->val_begin;
            *len = d->nbytes - d->val_begin;
            break;
        default:
            *begin = 0;
            *len = d->nbytes;
            break;
    }
}

static const char *split_name(ms_split s) {
    return s == MS_SPLIT_TRAIN ? "training split" : s == MS_SPLIT_VAL ? "validation split" : "file";
}

size_t ms_text_data_sample_start(const ms_text_data *d, ms_split s, uint64_t seed, uint64_t batch,
                                 int B, int r) {
    size_t begin, len;
    ms_text_data_split(d, s, &begin, &len);
    const size_t win = (size_t)d->seq_len + 1;
    if (len < win) return 0; /* callers check first; keep the result in range regardless */
    const uint64_t nstarts = (uint64_t)(len - win) + 1;
    /* 64 random bits rather than ms_philox_uniform's 24: with 24 bits a file over 16 MiB
     * would have starts that are never drawn. The modulo bias is below nstarts / 2^64. */
    uint32_t w[4];
    ms_philox_words(seed, MS_DATA_STREAM_BASE + (uint64_t)s, batch * (uint64_t)B + (uint64_t)r, w);
    const uint64_t x = ((uint64_t)w[0] << 32) | w[1];
    return (size_t)(x % nstarts);
}

static ms_status check_rows(const ms_text_data *d, int B, int r0, int nrows, const int32_t *inputs,
                            ms_error *err) {
    if (!d->bytes) return ms_fail(err, MS_ERR_INVALID, "text data: the dataset is not open");
    if (B < 1 || r0 < 0 || nrows < 0 || r0 > B - nrows)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: rows [%d, %d + %d) are not inside a batch of %d rows", d->path, r0, r0,
                       nrows, B);
    if (nrows > 0 && !inputs)
        return ms_fail(err, MS_ERR_INVALID, "%s: no inputs buffer given", d->path);
    return MS_OK;
}

static void copy_window(const uint8_t *w, int T, int32_t *in, int32_t *tg) {
    for (int t = 0; t < T; t++) in[t] = w[t];
    if (tg)
        for (int t = 0; t < T; t++) tg[t] = w[t + 1];
}

ms_status ms_text_data_sample(const ms_text_data *d, ms_split s, uint64_t seed, uint64_t batch,
                              int B, int r0, int nrows, int32_t *inputs, int32_t *targets,
                              ms_error *err) {
    MS_CHECK(check_rows(d, B, r0, nrows, inputs, err));
    size_t begin, len;
    ms_text_data_split(d, s, &begin, &len);
    const int T = d->seq_len;
    if (len < (size_t)T + 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: the %s has %zu bytes, less than one window of %d bytes; open the data "
                       "with a val_fraction that leaves it at least that much",
                       d->path, split_name(s), len, T + 1);
    for (int k = 0; k < nrows; k++) {
        size_t start = ms_text_data_sample_start(d, s, seed, batch, B, r0 + k);
        copy_window(d->bytes + begin + start, T, inputs + (size_t)k * T,
                    targets ? targets + (size_t)k * T : NULL);
    }
    return MS_OK;
}

uint64_t ms_text_data_eval_batches(const ms_text_data *d, ms_split s, int B) {
    size_t begin, len;
    ms_text_data_split(d, s, &begin, &len);
    if (B < 1 || d->seq_len < 1) return 0;
    return (uint64_t)len / ((uint64_t)B * ((uint64_t)d->seq_len + 1));
}

ms_status ms_text_data_eval(const ms_text_data *d, ms_split s, uint64_t batch, int B, int r0,
                            int nrows, int32_t *inputs, int32_t *targets, ms_error *err) {
    MS_CHECK(check_rows(d, B, r0, nrows, inputs, err));
    size_t begin, len;
    ms_text_data_split(d, s, &begin, &len);
    const int T = d->seq_len;
    const uint64_t nb = ms_text_data_eval_batches(d, s, B);
    if (batch >= nb)
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: evaluation batch %llu does not fit: the %s has %zu bytes, enough for "
                       "%llu batches of %d rows x %d bytes; evaluate at most %llu batches, use a "
                       "smaller batch or seq_len, or a longer text",
                       d->path, (unsigned long long)batch, split_name(s), len,
                       (unsigned long long)nb, B, T + 1, (unsigned long long)nb);
    for (int k = 0; k < nrows; k++) {
        /* batch < nb bounds every offset below len, so nothing here overflows. */
        size_t start = ((size_t)batch * (size_t)B + (size_t)(r0 + k)) * ((size_t)T + 1);
        copy_window(d->bytes + begin + start, T, inputs + (size_t)k * T,
                    targets ? targets + (size_t)k * T : NULL);
    }
    return MS_OK;
}

ms_status ms_dp_rows(int B, int dp, int dp_rank, int *r0, int *nrows, ms_error *err) {
    if (dp < 1 || dp_rank < 0 || dp_rank >= dp)
        return ms_fail(err, MS_ERR_INVALID, "data parallel rank %d of %d is not valid", dp_rank,
                       dp);
    if (B < 1 || B % dp != 0)
        return ms_fail(err, MS_ERR_INVALID,
                       "batch size %d is not divisible by the data-parallel degree %d; use a batch "
                       "size that is a multiple of %d",
                       B, dp, dp);
    *nrows = B / dp;
    *r0 = dp_rank * *nrows;
    return MS_OK;
}

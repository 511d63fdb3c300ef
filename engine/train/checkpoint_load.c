/* checkpoint_load.c - loading a distributed checkpoint under any strategy, describing it,
 * and exporting its parameters as one Hugging Face file (see checkpoint.h). */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/dist/placement.h"
#include "engine/io/safetensors.h"
#include "engine/model/gpt.h"
#include "engine/train/checkpoint_internal.h"

/* The files of one checkpoint, each checked (size, CRC) and read on first use. */
typedef struct file_cache {
    const char *step_dir;
    const ckpt_meta *m;
    ms_st_file *f; /* [nfiles], loaded ones have a path */
} file_cache;

static ms_status cached_file(file_cache *fc, int rank, const ms_st_file **out, ms_error *err) {
    int i = 0;
    while (i < fc->m->nfiles && fc->m->files[i].rank != rank) i++;
    if (i == fc->m->nfiles)
        return ms_fail(err, MS_ERR_INVALID, "checkpoint %s: no file of rank %d", fc->step_dir,
                       rank);
    if (!fc->f[i].path) {
        MS_CHECK(ckpt_file_check(fc->step_dir, &fc->m->files[i], err));
        char name[64], path[1200];
        ckpt_file_name(rank, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", fc->step_dir, name);
        MS_CHECK(ms_safetensors_read(path, &fc->f[i], err));
    }
    *out = &fc->f[i];
    return MS_OK;
}

static void cache_free(file_cache *fc) {
    for (int i = 0; i < fc->m->nfiles; i++) ms_safetensors_free(&fc->f[i]);
    free(fc->f);
}

/* Fills box (start, shape) of tensor c from its pieces (which tile c exactly: meta.json's
 * reader checked that); fails unless the files hold the pieces meta.json describes. */
static ms_status fill_box(file_cache *fc, const ckpt_tensor *c, const int64_t *start,
                          const int64_t *shape, float *out, ms_error *err) {
    int nd = c->gshape.ndim;
    int64_t want = 1, got = 0;
    for (int d = 0; d < nd; d++) want *= shape[d];
    for (int k = 0; k < c->np; k++) {
        const ckpt_piece *p = &c->pieces[k];
        bool meets = true;
        for (int d = 0; d < nd && meets; d++)
            meets = p->start[d] < start[d] + shape[d] && start[d] < p->start[d] + p->shape[d];
        if (!meets) continue;
        const ms_st_file *f;
        MS_CHECK(cached_file(fc, p->writer, &f, err));
        const ms_st_tensor *st = ms_safetensors_find(f, p->key);
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= p->shape[d];
        if (!st || st->ndim != nd || st->numel != n)
            return ms_fail(err, MS_ERR_INVALID,
                           "checkpoint %s: rank-%05d.safetensors lacks %s as meta.json "
                           "describes it",
                           fc->step_dir, p->writer, p->key);
        if (st->dtype != c->dtype) /* read widened either way: the files are not meta.json's */
            return ms_fail(err, MS_ERR_INVALID,
                           "checkpoint %s: rank-%05d.safetensors holds %s as %s, meta.json says "
                           "%s: the files and meta.json disagree (restore them, or resume from "
                           "another checkpoint)",
                           fc->step_dir, p->writer, p->key, st->dtype == MS_BF16 ? "BF16" : "F32",
                           c->dtype == MS_BF16 ? "BF16" : "F32");
        got += ckpt_copy_overlap(nd, p->start, p->shape, st->data, start, shape, out);
    }
    if (got != want)
        return ms_fail(err, MS_ERR_INVALID,
                       "checkpoint %s: the pieces of %s (%s) cover %lld of the %lld elements "
                       "needed (a missing or overlapping piece)",
                       fc->step_dir, c->name, ckpt_kind_name(c->kind), (long long)got,
                       (long long)want);
    return MS_OK;
}

static const ckpt_tensor *find_tensor(const ckpt_meta *m, const char *name, ms_state_kind kind) {
    for (int i = 0; i < m->nt; i++)
        if (m->t[i].kind == kind && !strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

static bool same_shape(const ms_shape *a, const ms_shape *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->d[d] != b->d[d]) return false;
    return true;
}

/* This rank's part of a load: every box read into new buffers (bufs[i], NULL where this rank
 * holds none of state i); nothing in t changes. */
static ms_status read_boxes(ms_trainer *t, const ckpt_meta *m, const char *step_dir, float **bufs,
                            ms_error *err) {
    const ms_train_opts *o = ms_trainer_opts(t);
    const ms_ckpt_info *in = &m->info;
    if (in->seed != o->seed || in->batch != o->batch || in->seq != o->seq)
        return ms_fail(err, MS_ERR_INVALID,
                       "checkpoint %s was saved with --seed %" PRIu64 " --batch %d --seq %d; "
                       "this run has --seed %" PRIu64 " --batch %d --seq %d (resume with the "
                       "same data order)",
                       step_dir, in->seed, in->batch, in->seq, o->seed, o->batch, o->seq);
    int n = ms_trainer_num_state(t);
    /* inference loads the parameters and buffers alone, not the moments */
    int matched = 0;
    for (int i = 0; i < m->nt; i++)
        matched +=
            !o->inference || m->t[i].kind == MS_STATE_PARAM || m->t[i].kind == MS_STATE_BUFFER;
    int distinct = 0;
    file_cache fc = {
        .step_dir = step_dir, .m = m, .f = xcalloc((size_t)m->nfiles + 1, sizeof(ms_st_file))};
    ms_status st = MS_OK;
    for (int i = 0; i < n && st == MS_OK; i++) {
        ms_state_tensor s;
        ms_trainer_state(t, i, &s);
        const ckpt_tensor *c = find_tensor(m, s.param, s.kind);
        if (!c) {
            st = ms_fail(err, MS_ERR_INVALID,
                         "checkpoint %s has no %s of %s: it is of another model (model %s)",
                         step_dir, ckpt_kind_name(s.kind), s.param, in->model);
            break;
        }
        if (!same_shape(&c->gshape, &s.gshape)) {
            char a[64], b[64];
            st = ms_fail(err, MS_ERR_INVALID,
                         "checkpoint %s: %s has shape %s, the model expects %s (another model "
                         "configuration)",
                         step_dir, s.param, ms_shape_str(c->gshape.d, c->gshape.ndim, a, sizeof a),
                         ms_shape_str(s.gshape.d, s.gshape.ndim, b, sizeof b));
            break;
        }
        bool first = true;
        for (int k = 0; k < i && first; k++) {
            ms_state_tensor e;
            ms_trainer_state(t, k, &e);
            first = !(e.kind == s.kind && !strcmp(e.param, s.param));
        }
        distinct += first;
        if (!s.local || s.n == 0) continue;
        int64_t start[MS_MAX_DIMS], shape[MS_MAX_DIMS];
        ms_local_box(&s.pl, &s.mesh->mesh, s.mesh->coords, s.gshape.ndim, s.gshape.d, start, shape);
        bufs[i] = xmalloc(sizeof(float) * s.n);
        st = fill_box(&fc, c, start, shape, bufs[i], err);
    }
    if (st == MS_OK && distinct != matched)
        st = ms_fail(err, MS_ERR_INVALID,
                     "checkpoint %s holds %d state tensors, the model has %d: it is of another "
                     "model (model %s)",
                     step_dir, matched, distinct, in->model);
    cache_free(&fc);
    return st;
}

ms_status ms_ckpt_load(ms_trainer *t, const char *dir, ms_ckpt_info *info, ms_error *err) {
    ms_ctx *ctx = ms_trainer_ctx(t);
    char step_dir[1100];
    ckpt_meta m = {0};
    int n = ms_trainer_num_state(t);
    float **bufs = xcalloc((size_t)(n ? n : 1), sizeof *bufs);
    /* offload: nothing in flight may land on the device after the load */
    ms_status st = ms_trainer_settle(t, err);
    if (st == MS_OK) st = ckpt_resolve(dir, step_dir, sizeof step_dir, err);
    if (st == MS_OK) st = ckpt_meta_read(step_dir, &m, err);
    if (st == MS_OK) st = read_boxes(t, &m, step_dir, bufs, err);
    /* Every rank loads, or none does; all of them report the first failing rank's reason. */
    float mine = st != MS_OK ? (float)ctx->rank : (float)ctx->world_size, first = 0;
    ms_error e = {0};
    ms_status agreed = ms_all_reduce(ctx->world, &mine, &first, 1, MS_REDUCE_MIN, &e);
    if (agreed == MS_OK && first < ctx->world_size) {
        char msg[MS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", st != MS_OK ? err->msg : "");
        agreed = ms_broadcast_bytes(ctx->world, msg, sizeof msg, (int)first, &e);
        if (agreed == MS_OK && st == MS_OK) st = ms_fail(err, MS_ERR_INVALID, "%s", msg);
    }
    if (agreed != MS_OK) {
        *err = e;
        st = agreed;
    }
    for (int i = 0; i < n; i++) {
        if (st == MS_OK && bufs[i]) {
            ms_state_tensor s;
            ms_trainer_state(t, i, &s);
            /* onto the rank's device where the state lives there */
            st = ms_device_move(ctx->device, s.local, bufs[i], sizeof(float) * s.n, err);
        }
        free(bufs[i]);
    }
    free(bufs);
    if (st == MS_OK) {
        ms_trainer_state_written(t);
        ms_trainer_set_step(t, m.info.step);
        if (info) *info = m.info;
    }
    ckpt_meta_free(&m);
    return st;
}

/* --- describe and export ------------------------------------------------------------------- */

static double numel_of(const ms_shape *s) {
    double n = 1;
    for (int d = 0; d < s->ndim; d++) n *= (double)s->d[d];
    return n;
}

ms_status ms_ckpt_describe(const char *dir, ms_ckpt_info *info, ms_strbuf *text, ms_error *err) {
    char step_dir[1100];
    ckpt_meta m;
    MS_CHECK(ckpt_resolve(dir, step_dir, sizeof step_dir, err));
    MS_CHECK(ckpt_meta_read(step_dir, &m, err));
    if (info) *info = m.info;
    if (text) {
        const ms_ckpt_info *in = &m.info;
        ms_strbuf_printf(text, "checkpoint %s\n", step_dir);
        ms_strbuf_printf(text,
                         "  next step %lld of %d (%lld skipped before it), saved by %d ranks\n",
                         (long long)in->step, in->steps, (long long)in->skipped, in->world);
        ms_strbuf_printf(text, "  model %s, strategy %s\n", *in->model ? in->model : "-",
                         *in->strategy ? in->strategy : "-");
        ms_strbuf_printf(text, "  data: seed %" PRIu64 ", batch %d, seq %d\n", in->seed, in->batch,
                         in->seq);
        double bytes[CKPT_KINDS] = {0}, count[CKPT_KINDS] = {0};
        for (int i = 0; i < m.nt; i++) {
            bytes[m.t[i].kind] += 4 * numel_of(&m.t[i].gshape);
            count[m.t[i].kind]++;
        }
        for (int k = 0; k < CKPT_KINDS; k++)
            if (count[k] > 0)
                ms_strbuf_printf(text, "  %-10s %4.0f tensors, %10.2f MiB (f32)\n",
                                 ckpt_kind_name((ms_state_kind)k), count[k], bytes[k] / 1048576.0);
        for (int f = 0; f < m.nfiles; f++) {
            char name[64];
            ckpt_file_name(m.files[f].rank, name, sizeof name);
            ms_strbuf_printf(text, "  %s  %10.2f MiB  crc32 %08x\n", name,
                             (double)m.files[f].bytes / 1048576.0, m.files[f].crc);
        }
    }
    ckpt_meta_free(&m);
    return MS_OK;
}

ms_status ms_ckpt_verify(const char *dir, ms_ckpt_info *info, ms_error *err) {
    char step_dir[1100];
    ckpt_meta m;
    MS_CHECK(ckpt_resolve(dir, step_dir, sizeof step_dir, err));
    MS_CHECK(ckpt_meta_read(step_dir, &m, err));
    ms_status st = MS_OK;
    for (int f = 0; f < m.nfiles && st == MS_OK; f++)
        st = ckpt_file_check(step_dir, &m.files[f], err);
    if (st == MS_OK && info) *info = m.info;
    ckpt_meta_free(&m);
    return st;
}

static int by_name_desc(const void *a, const void *b) {
    return strcmp(*(char *const *)b, *(char *const *)a);
}

/* The step folders of a checkpoint folder, newest first (names sort by step: %08lld). */
static int step_folders(const char *dir, char ***out) {
    DIR *d = opendir(dir);
    char **names = NULL;
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, "step-", 5)) {
            names = xrealloc(names, sizeof *names * (size_t)(n + 1));
            names[n++] = xstrdup(de->d_name);
        }
    if (d) closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, by_name_desc);
    *out = names;
    return n;
}

ms_status ms_ckpt_newest_intact(const char *dir, ms_ckpt_info *info, ms_strbuf *skipped,
                                ms_error *err) {
    char **names;
    int n = step_folders(dir, &names);
    ms_status st = MS_ERR_IO;
    for (int i = 0; i < n; i++) {
        char path[1100];
        ms_error why = {0};
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (st != MS_OK && ms_ckpt_verify(path, info, &why) == MS_OK)
            st = MS_OK;
        else if (st != MS_OK && skipped)
            ms_strbuf_printf(skipped, "%s\n", why.msg);
        free(names[i]);
    }
    free(names);
    if (st != MS_OK)
        return ms_fail(err, MS_ERR_IO, "no intact checkpoint in %s (%d step folder%s checked)", dir,
                       n, n == 1 ? "" : "s");
    return MS_OK;
}

ms_status ms_ckpt_export(const char *dir, const char *out_path, int *n_tensors, ms_error *err) {
    char step_dir[1100];
    ckpt_meta m;
    MS_CHECK(ckpt_resolve(dir, step_dir, sizeof step_dir, err));
    MS_CHECK(ckpt_meta_read(step_dir, &m, err));
    /* memory below is sized by meta.json's shapes, which fit in its files' sizes: the files
     * must have those sizes before it is allocated */
    ms_status st = ckpt_files_sized(step_dir, &m, err);
    if (st != MS_OK) {
        ckpt_meta_free(&m);
        return st;
    }
    file_cache fc = {
        .step_dir = step_dir, .m = &m, .f = xcalloc((size_t)m.nfiles + 1, sizeof(ms_st_file))};
    ms_st_entry *e = xcalloc((size_t)m.nt + 1, sizeof *e);
    int n = 0;
    for (int i = 0; i < m.nt && st == MS_OK; i++) {
        const ckpt_tensor *c = &m.t[i];
        if (c->kind != MS_STATE_PARAM && c->kind != MS_STATE_BUFFER) continue; /* as state_dict */
        int64_t zero[MS_MAX_DIMS] = {0}, numel = 1;
        for (int d = 0; d < c->gshape.ndim; d++) numel *= c->gshape.d[d]; /* checked on read */
        float *full = malloc(sizeof(float) * ((size_t)numel + 1));
        if (!full) {
            char name[MS_SAFE_LEN];
            st = ms_fail(err, MS_ERR_NOMEM,
                         "checkpoint %s: cannot allocate %lld floats for %s; export on a machine "
                         "with more memory",
                         step_dir, (long long)numel, ms_safe_str(name, sizeof name, c->name));
            break;
        }
        st = fill_box(&fc, c, zero, c->gshape.d, full, err);
        ms_shape fs;
        ms_model_checkpoint_shape(c->name, &c->gshape, &fs);
        e[n] = (ms_st_entry){.name = c->name, .dtype = MS_F32, .ndim = fs.ndim, .data = full};
        memcpy(e[n].shape, fs.d, sizeof e[n].shape);
        n++;
    }
    if (st == MS_OK) {
        ms_st_kv meta[2] = {{"format", "pt"}, {"producer", "meshscope"}};
        st = ms_safetensors_write(out_path, e, n, meta, 2, err);
    }
    for (int i = 0; i < n; i++) free((void *)e[i].data);
    free(e);
    cache_free(&fc);
    ckpt_meta_free(&m);
    if (st == MS_OK && n_tensors) *n_tensors = n;
    return st;
}

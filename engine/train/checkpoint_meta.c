/* checkpoint_meta.c - the piece plan, meta.json, file checksums and box copies of
 * distributed checkpoints (see checkpoint.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "engine/core/xalloc.h"
#include "engine/dist/placement.h"
#include "engine/io/fileio.h"
#include "engine/train/checkpoint_internal.h"

static const char *const kind_names[] = {"param", "exp_avg", "exp_avg_sq"};

const char *ckpt_kind_name(ms_state_kind k) {
    return (unsigned)k < 3 ? kind_names[k] : "?";
}

static int kind_of(const char *name) {
    for (int k = 0; k < 3; k++)
        if (!strcmp(kind_names[k], name)) return k;
    return -1;
}

void ckpt_file_name(int rank, char *out, size_t len) {
    snprintf(out, len, "rank-%05d.safetensors", rank);
}

/* --- the plan ------------------------------------------------------------------------------ */

static bool same_box(int nd, const int64_t *a0, const int64_t *a1, const int64_t *b0,
                     const int64_t *b1) {
    for (int d = 0; d < nd; d++)
        if (a0[d] != b0[d] || a1[d] != b1[d]) return false;
    return true;
}

/* The pieces of one state tensor: each distinct non-empty box of its mesh, first holder. */
static void plan_tensor(const ms_state_tensor *s, ckpt_tensor *out) {
    const ms_mesh *m = &s->mesh->mesh;
    int nd = s->gshape.ndim;
    int64_t(*st)[MS_MAX_DIMS] = xmalloc(sizeof *st * (size_t)m->size);
    int64_t(*ln)[MS_MAX_DIMS] = xmalloc(sizeof *ln * (size_t)m->size);
    out->pieces = xcalloc((size_t)m->size, sizeof *out->pieces);
    for (int j = 0; j < m->size; j++) {
        int coords[MS_MESH_MAX_DIMS];
        ms_mesh_coords(m, m->ranks[j], coords);
        ms_local_box(&s->pl, m, coords, nd, s->gshape.d, st[j], ln[j]);
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= ln[j][d];
        bool dup = n == 0;
        for (int k = 0; k < j && !dup; k++) dup = same_box(nd, st[j], ln[j], st[k], ln[k]);
        if (dup) continue;
        ckpt_piece *p = &out->pieces[out->np++];
        p->writer = m->ranks[j];
        snprintf(p->key, sizeof p->key, "%s/%s", s->param, ckpt_kind_name(s->kind));
        memcpy(p->start, st[j], sizeof p->start);
        memcpy(p->shape, ln[j], sizeof p->shape);
    }
    free(st), free(ln);
}

void ckpt_plan(ms_trainer *t, ckpt_meta *out) {
    memset(out, 0, sizeof *out);
    int n = ms_trainer_num_state(t);
    out->t = xcalloc((size_t)(n ? n : 1), sizeof *out->t);
    for (int i = 0; i < n; i++) {
        ms_state_tensor s;
        ms_trainer_state(t, i, &s);
        bool seen = false;
        for (int k = 0; k < out->nt && !seen; k++)
            seen = out->t[k].kind == s.kind && !strcmp(out->t[k].name, s.param);
        if (seen) continue; /* the tied embedding's second holder */
        ckpt_tensor *c = &out->t[out->nt++];
        c->name = xstrdup(s.param);
        c->kind = s.kind;
        c->gshape = s.gshape;
        c->state_index = i;
        plan_tensor(&s, c);
    }
}

void ckpt_meta_free(ckpt_meta *m) {
    for (int i = 0; i < m->nt; i++) {
        free(m->t[i].name);
        free(m->t[i].pieces);
    }
    free(m->t);
    free(m->files);
    memset(m, 0, sizeof *m);
}

/* --- meta.json ----------------------------------------------------------------------------- */

static cJSON *int_array(const int64_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

static cJSON *meta_json(const ckpt_meta *m) {
    const ms_ckpt_info *in = &m->info;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(j, "version", CKPT_VERSION);
    cJSON_AddNumberToObject(j, "step", (double)in->step);
    cJSON_AddNumberToObject(j, "skipped", (double)in->skipped);
    cJSON_AddNumberToObject(j, "world", in->world);
    cJSON_AddStringToObject(j, "strategy", in->strategy);
    cJSON_AddStringToObject(j, "model", in->model);
    cJSON *tr = cJSON_AddObjectToObject(j, "train");
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, in->seed); /* a string: doubles lose 64-bit seeds */
    cJSON_AddStringToObject(tr, "seed", seed);
    cJSON_AddNumberToObject(tr, "batch", in->batch);
    cJSON_AddNumberToObject(tr, "seq", in->seq);
    cJSON_AddNumberToObject(tr, "steps", in->steps);
    cJSON *files = cJSON_AddArrayToObject(j, "files");
    for (int i = 0; i < m->nfiles; i++) {
        cJSON *f = cJSON_CreateObject();
        char name[64];
        ckpt_file_name(m->files[i].rank, name, sizeof name);
        cJSON_AddStringToObject(f, "name", name);
        cJSON_AddNumberToObject(f, "rank", m->files[i].rank);
        cJSON_AddNumberToObject(f, "bytes", (double)m->files[i].bytes);
        cJSON_AddNumberToObject(f, "crc32", m->files[i].crc);
        cJSON_AddItemToArray(files, f);
    }
    cJSON *ts = cJSON_AddArrayToObject(j, "tensors");
    for (int i = 0; i < m->nt; i++) {
        const ckpt_tensor *c = &m->t[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", c->name);
        cJSON_AddStringToObject(o, "kind", ckpt_kind_name(c->kind));
        cJSON_AddStringToObject(o, "dtype", "F32");
        cJSON_AddItemToObject(o, "shape", int_array(c->gshape.d, c->gshape.ndim));
        cJSON *ps = cJSON_AddArrayToObject(o, "pieces");
        for (int k = 0; k < c->np; k++) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddNumberToObject(p, "rank", c->pieces[k].writer);
            cJSON_AddStringToObject(p, "key", c->pieces[k].key);
            cJSON_AddItemToObject(p, "start", int_array(c->pieces[k].start, c->gshape.ndim));
            cJSON_AddItemToObject(p, "shape", int_array(c->pieces[k].shape, c->gshape.ndim));
            cJSON_AddItemToArray(ps, p);
        }
        cJSON_AddItemToArray(ts, o);
    }
    return j;
}

static ms_status write_text(FILE *f, void *arg, ms_error *err) {
    const char *text = arg;
    return ms_durable_fwrite(f, text, strlen(text), "meta.json", err);
}

ms_status ckpt_meta_write(const char *path, const ckpt_meta *m, ms_error *err) {
    cJSON *j = meta_json(m);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return ms_fail(err, MS_ERR_NOMEM, "checkpoint: cannot format %s", path);
    ms_status st = ms_write_file_durable(path, write_text, text, err);
    cJSON_free(text);
    return st;
}

/* Reading: every field checked; errors name the file and the field. */
typedef struct reader {
    const char *path;
    ms_error *err;
} reader;

static ms_status bad(const reader *r, const char *what) {
    return ms_fail(r->err, MS_ERR_INVALID, "checkpoint %s: %s", r->path, what);
}

static bool get_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble) return false;
    *out = (int64_t)v->valuedouble;
    return *out >= lo && *out <= hi;
}

static bool get_dims(const cJSON *o, const char *key, int ndim, int64_t *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != ndim) return false;
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e15) return false;
        out[i++] = (int64_t)v->valuedouble;
    }
    return true;
}

static void copy_str(const cJSON *o, const char *key, char *out, size_t len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    snprintf(out, len, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static ms_status read_tensor(const reader *r, const cJSON *o, const ckpt_meta *m, ckpt_tensor *c) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(o, "pieces");
    if (!cJSON_IsString(name) || !cJSON_IsString(kind) || kind_of(kind->valuestring) < 0 ||
        !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > MS_MAX_DIMS || !cJSON_IsArray(ps))
        return bad(r, "a tensor entry lacks name, kind (param, exp_avg, exp_avg_sq), shape or "
                      "pieces");
    c->name = xstrdup(name->valuestring);
    c->kind = (ms_state_kind)kind_of(kind->valuestring);
    c->gshape.ndim = cJSON_GetArraySize(shape);
    if (!get_dims(o, "shape", c->gshape.ndim, c->gshape.d)) return bad(r, "a bad tensor shape");
    c->pieces = xcalloc((size_t)cJSON_GetArraySize(ps) + 1, sizeof *c->pieces);
    const cJSON *p;
    cJSON_ArrayForEach(p, ps) {
        ckpt_piece *q = &c->pieces[c->np];
        int64_t rank;
        const cJSON *key = cJSON_GetObjectItemCaseSensitive(p, "key");
        if (!get_int(p, "rank", 0, 1 << 20, &rank) || !cJSON_IsString(key) ||
            strlen(key->valuestring) >= sizeof q->key ||
            !get_dims(p, "start", c->gshape.ndim, q->start) ||
            !get_dims(p, "shape", c->gshape.ndim, q->shape))
            return bad(r, "a piece lacks rank, key, start or shape (or has the wrong rank)");
        bool known = false;
        for (int f = 0; f < m->nfiles && !known; f++) known = m->files[f].rank == rank;
        if (!known) return bad(r, "a piece names a rank with no file in \"files\"");
        for (int d = 0; d < c->gshape.ndim; d++)
            if (q->start[d] + q->shape[d] > c->gshape.d[d])
                return bad(r, "a piece reaches past its tensor's shape");
        q->writer = (int)rank;
        snprintf(q->key, sizeof q->key, "%s", key->valuestring);
        c->np++;
    }
    return MS_OK;
}

static ms_status parse_meta(const reader *r, const cJSON *j, ckpt_meta *m) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    int64_t version, v;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT))
        return bad(r, "not a meshscope checkpoint (no \"format\": \"" CKPT_FORMAT "\")");
    if (!get_int(j, "version", 1, 1000, &version) || version != CKPT_VERSION)
        return bad(r, "an unknown version (this meshscope reads version 1)");
    ms_ckpt_info *in = &m->info;
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "train");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(tr, "seed");
    if (!get_int(j, "step", 0, INT64_C(1) << 40, &in->step) ||
        !get_int(j, "skipped", 0, INT64_C(1) << 40, &in->skipped) ||
        !get_int(j, "world", 1, 1 << 20, &v) || !cJSON_IsObject(tr) || !cJSON_IsString(seed))
        return bad(r, "step, skipped, world or train is missing or out of range");
    in->world = (int)v;
    in->seed = strtoull(seed->valuestring, NULL, 10);
    if (!get_int(tr, "batch", 1, 1 << 30, &v)) return bad(r, "train.batch is missing");
    in->batch = (int)v;
    if (!get_int(tr, "seq", 1, 1 << 30, &v)) return bad(r, "train.seq is missing");
    in->seq = (int)v;
    if (!get_int(tr, "steps", 0, 1 << 30, &v)) return bad(r, "train.steps is missing");
    in->steps = (int)v;
    copy_str(j, "strategy", in->strategy, sizeof in->strategy);
    copy_str(j, "model", in->model, sizeof in->model);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "tensors");
    if (!cJSON_IsArray(files) || !cJSON_IsArray(ts)) return bad(r, "no files or tensors list");
    m->files = xcalloc((size_t)cJSON_GetArraySize(files) + 1, sizeof *m->files);
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        int64_t rank, bytes, crc;
        if (!get_int(f, "rank", 0, 1 << 20, &rank) ||
            !get_int(f, "bytes", 0, INT64_C(1) << 50, &bytes) ||
            !get_int(f, "crc32", 0, UINT32_MAX, &crc))
            return bad(r, "a file entry lacks rank, bytes or crc32");
        m->files[m->nfiles++] =
            (ckpt_file){.rank = (int)rank, .bytes = (uint64_t)bytes, .crc = (uint32_t)crc};
    }
    m->t = xcalloc((size_t)cJSON_GetArraySize(ts) + 1, sizeof *m->t);
    const cJSON *o;
    cJSON_ArrayForEach(o, ts) {
        MS_CHECK(read_tensor(r, o, m, &m->t[m->nt]));
        m->nt++;
    }
    return MS_OK;
}

ms_status ckpt_meta_read(const char *step_dir, ckpt_meta *m, ms_error *err) {
    memset(m, 0, sizeof *m);
    char path[1100];
    snprintf(path, sizeof path, "%s/meta.json", step_dir);
    uint8_t *text = NULL;
    size_t len = 0;
    MS_CHECK(ms_read_file(path, CKPT_META_MAX, &text, &len, err));
    cJSON *j = cJSON_ParseWithLength((const char *)text, len);
    free(text);
    reader r = {.path = path, .err = err};
    ms_status st = j ? parse_meta(&r, j, m) : bad(&r, "meta.json is not valid JSON");
    cJSON_Delete(j);
    if (st != MS_OK) {
        ckpt_meta_free(m);
        return st;
    }
    snprintf(m->info.path, sizeof m->info.path, "%s", step_dir);
    return MS_OK;
}

ms_status ckpt_resolve(const char *dir, char *step_dir, size_t len, ms_error *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/latest", dir);
    uint8_t *text = NULL;
    size_t n = 0;
    ms_error e = {0};
    if (ms_read_file(path, 256, &text, &n, &e) == MS_OK) {
        while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) text[--n] = '\0';
        bool ok = n > 5 && !strncmp((char *)text, "step-", 5) && !strchr((char *)text, '/');
        if (ok) snprintf(step_dir, len, "%s/%s", dir, (char *)text);
        free(text);
        if (!ok) return ms_fail(err, MS_ERR_INVALID, "checkpoint %s: a corrupt latest file", path);
        return MS_OK;
    }
    snprintf(path, sizeof path, "%s/meta.json", dir);
    if (access(path, F_OK) == 0) {
        snprintf(step_dir, len, "%s", dir);
        return MS_OK;
    }
    return ms_fail(err, MS_ERR_IO,
                   "no checkpoint in %s: neither a latest file nor meta.json (give the folder "
                   "that train --save-dir wrote, or one of its step-NNNNNNNN folders)",
                   dir);
}

/* --- files --------------------------------------------------------------------------------- */

ms_status ckpt_file_sum(const char *path, uint64_t *bytes, uint32_t *crc, ms_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ms_fail(err, MS_ERR_IO, "checkpoint: cannot read %s: %s", path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = xmalloc(CHUNK);
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t total = 0;
    ms_status st = MS_OK;
    for (;;) {
        ssize_t got = read(fd, buf, CHUNK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = ms_fail(err, MS_ERR_IO, "checkpoint: cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (got == 0) break;
        c = crc32(c, buf, (uInt)got);
        total += (uint64_t)got;
    }
    free(buf);
    close(fd);
    *bytes = total;
    *crc = (uint32_t)c;
    return st;
}

ms_status ckpt_file_check(const char *step_dir, const ckpt_file *f, ms_error *err) {
    char name[64], path[1200];
    ckpt_file_name(f->rank, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", step_dir, name);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ms_fail(err, MS_ERR_INVALID, "checkpoint %s: the shard %s is missing", step_dir,
                       name);
    if ((uint64_t)sb.st_size != f->bytes)
        return ms_fail(err, MS_ERR_INVALID,
                       "checkpoint %s: %s is %lld bytes, meta.json says %" PRIu64
                       " (truncated or replaced)",
                       step_dir, name, (long long)sb.st_size, f->bytes);
    uint64_t bytes;
    uint32_t crc;
    MS_CHECK(ckpt_file_sum(path, &bytes, &crc, err));
    if (crc != f->crc)
        return ms_fail(err, MS_ERR_INVALID,
                       "checkpoint %s: %s has CRC-32 %08x, meta.json says %08x (corrupt)", step_dir,
                       name, crc, f->crc);
    return MS_OK;
}

/* --- boxes --------------------------------------------------------------------------------- */

int64_t ckpt_copy_overlap(int ndim, const int64_t *src_start, const int64_t *src_shape,
                          const float *src, const int64_t *dst_start, const int64_t *dst_shape,
                          float *dst) {
    int64_t lo[MS_MAX_DIMS], ext[MS_MAX_DIMS], total = 1;
    for (int d = 0; d < ndim; d++) {
        int64_t a = src_start[d] > dst_start[d] ? src_start[d] : dst_start[d];
        int64_t b0 = src_start[d] + src_shape[d], b1 = dst_start[d] + dst_shape[d];
        int64_t b = b0 < b1 ? b0 : b1;
        if (b <= a) return 0;
        lo[d] = a;
        ext[d] = b - a;
        total *= ext[d];
    }
    if (ndim == 0) {
        dst[0] = src[0];
        return 1;
    }
    /* Runs along the last dim; an odometer over the others. */
    int64_t idx[MS_MAX_DIMS] = {0}, run = ext[ndim - 1];
    for (int64_t done = 0; done < total; done += run) {
        int64_t so = 0, doff = 0;
        for (int d = 0; d < ndim; d++) {
            so = so * src_shape[d] + (lo[d] + idx[d] - src_start[d]);
            doff = doff * dst_shape[d] + (lo[d] + idx[d] - dst_start[d]);
        }
        memcpy(dst + doff, src + so, sizeof(float) * (size_t)run);
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < ext[d]) break;
            idx[d] = 0;
        }
    }
    return total;
}

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

static const char *const kind_names[CKPT_KINDS] = {"param", "exp_avg", "exp_avg_sq", "buffer"};

const char *ckpt_kind_name(ms_state_kind k) {
    return (unsigned)k < CKPT_KINDS ? kind_names[k] : "?";
}

static int kind_of(const char *name) {
    for (int k = 0; k < CKPT_KINDS; k++)
        if (!strcmp(kind_names[k], name)) return k;
    return -1;
}

/* A dtype as safetensors and meta.json spell it. */
static const char *dtype_tag(ms_dtype dt) {
    return dt == MS_BF16 ? "BF16" : "F32";
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
        cJSON_AddStringToObject(o, "dtype", dtype_tag(c->dtype));
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

/* A whole number in lo..hi (checked in double first: a cast out of int64's range would be
 * undefined). */
static bool get_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi))
        return false;
    *out = (int64_t)v->valuedouble;
    return (double)*out == v->valuedouble && *out >= lo && *out <= hi;
}

/* The largest dim or start meta.json may give: far past any model, far from overflow. */
#define DIM_MAX 1e15

static bool get_dims(const cJSON *o, const char *key, int ndim, int64_t *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != ndim) return false;
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= DIM_MAX)) return false;
        out[i] = (int64_t)v->valuedouble;
        if ((double)out[i++] != v->valuedouble) return false; /* 1.5 is no dim */
    }
    return true;
}

/* Elements of a box, or -1 when its bytes (esize each) would not fit in int64 even without
 * its zero dims (so that no product of its dims overflows, such as the one that turns a
 * [3 * heads, rows, cols] weight into a Hugging Face [rows, 3 * heads * cols] one). */
static int64_t box_numel(int ndim, const int64_t *shape, size_t esize) {
    int64_t n = 1;
    bool empty = false;
    for (int d = 0; d < ndim; d++) {
        empty |= shape[d] == 0;
        if (shape[d] == 0) continue;
        if (n > INT64_MAX / (int64_t)esize / shape[d]) return -1;
        n *= shape[d];
    }
    return empty ? 0 : n;
}

static void copy_str(const cJSON *o, const char *key, char *out, size_t len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    snprintf(out, len, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static int cmp_file(const void *a, const void *b) {
    const ckpt_file *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The file of rank in m's files, sorted by rank once read. */
static const ckpt_file *file_of(const ckpt_meta *m, int64_t rank) {
    ckpt_file key = {.rank = (int)rank};
    return bsearch(&key, m->files, (size_t)m->nfiles, sizeof key, cmp_file);
}

/* "tensor NAME (KIND)" for messages, NAME made safe to print. */
static const char *tensor_str(const ckpt_tensor *c, char *out, size_t len) {
    char name[MS_SAFE_LEN];
    snprintf(out, len, "tensor %s (%s)", ms_safe_str(name, sizeof name, c->name),
             ckpt_kind_name(c->kind));
    return out;
}

/* Piece k of c: "piece K (rank R, start [..], shape [..])". */
static const char *piece_str(const ckpt_tensor *c, int k, char *out, size_t len) {
    char a[128], b[128];
    const ckpt_piece *p = &c->pieces[k];
    snprintf(out, len, "piece %d (rank %d, start %s, shape %s)", k, p->writer,
             ms_shape_str(p->start, c->gshape.ndim, a, sizeof a),
             ms_shape_str(p->shape, c->gshape.ndim, b, sizeof b));
    return out;
}

static ms_status read_piece(const reader *r, const cJSON *p, const ckpt_meta *m, ckpt_tensor *c) {
    ckpt_piece *q = &c->pieces[c->np];
    int nd = c->gshape.ndim;
    int64_t rank;
    char what[256], box[400];
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(p, "key");
    if (!get_int(p, "rank", 0, 1 << 20, &rank) || !cJSON_IsString(key) ||
        strlen(key->valuestring) >= sizeof q->key || !get_dims(p, "start", nd, q->start) ||
        !get_dims(p, "shape", nd, q->shape))
        return bad(r, "a piece lacks rank, key, start or shape (or has the wrong rank)");
    if (!file_of(m, rank)) return bad(r, "a piece names a rank with no file in \"files\"");
    q->writer = (int)rank;
    snprintf(q->key, sizeof q->key, "%s", key->valuestring);
    tensor_str(c, what, sizeof what);
    piece_str(c, c->np, box, sizeof box);
    for (int d = 0; d < nd; d++)
        if (q->start[d] + q->shape[d] > c->gshape.d[d]) /* each at most DIM_MAX: no overflow */
            return ms_fail(r->err, MS_ERR_INVALID,
                           "checkpoint %s: %s: %s reaches past its tensor's shape; meta.json "
                           "is corrupt (restore it, or resume from another checkpoint)",
                           r->path, what, box);
    if (box_numel(nd, q->shape, ms_dtype_size(c->dtype)) <= 0)
        return ms_fail(r->err, MS_ERR_INVALID,
                       "checkpoint %s: %s: %s is empty; meta.json is corrupt (a checkpoint "
                       "writes no empty pieces)",
                       r->path, what, box);
    c->np++;
    return MS_OK;
}

static ms_status read_tensor(const reader *r, const cJSON *o, const ckpt_meta *m, ckpt_tensor *c) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(o, "pieces");
    if (!cJSON_IsString(name) || !cJSON_IsString(kind) || kind_of(kind->valuestring) < 0 ||
        !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > MS_MAX_DIMS || !cJSON_IsArray(ps))
        return bad(r,
                   "a tensor entry lacks name, kind (param, exp_avg, exp_avg_sq, buffer), shape or "
                   "pieces");
    c->name = xstrdup(name->valuestring);
    c->kind = (ms_state_kind)kind_of(kind->valuestring);
    if (!cJSON_IsString(dtype) ||
        (strcmp(dtype->valuestring, "F32") && strcmp(dtype->valuestring, "BF16")))
        return bad(r, "a tensor entry's dtype is missing or neither F32 nor BF16");
    c->dtype = strcmp(dtype->valuestring, "F32") ? MS_BF16 : MS_F32;
    c->gshape.ndim = cJSON_GetArraySize(shape);
    if (!get_dims(o, "shape", c->gshape.ndim, c->gshape.d)) return bad(r, "a bad tensor shape");
    char what[256];
    if (box_numel(c->gshape.ndim, c->gshape.d, ms_dtype_size(c->dtype)) < 0)
        return ms_fail(r->err, MS_ERR_INVALID,
                       "checkpoint %s: %s: its shape has more bytes than a file can hold; "
                       "meta.json is corrupt",
                       r->path, tensor_str(c, what, sizeof what));
    c->pieces = xcalloc((size_t)cJSON_GetArraySize(ps) + 1, sizeof *c->pieces);
    const cJSON *p;
    cJSON_ArrayForEach(p, ps) MS_CHECK(read_piece(r, p, m, c));
    return MS_OK;
}

/* --- exact coverage ------------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The grid that the edges of c's pieces cut its shape into: per dim the sorted distinct edges
 * edge[d][0..ne[d]) (0 and the dim among them), cells the product of the intervals. A
 * checkpoint's pieces are such a grid's cells (boxes of shards over a mesh), so a grid of far
 * more cells than pieces can be no tiling, and is refused before it is built. */
typedef struct grid {
    int64_t *edge[MS_MAX_DIMS];
    int ne[MS_MAX_DIMS];
    int64_t cells;
    int *owner; /* [cells]: the piece that covers the cell, -1 none yet */
} grid;

static void grid_free(grid *g) {
    for (int d = 0; d < MS_MAX_DIMS; d++) free(g->edge[d]);
    free(g->owner);
}

static bool grid_build(const ckpt_tensor *c, grid *g) {
    int nd = c->gshape.ndim;
    g->cells = 1;
    for (int d = 0; d < nd; d++) {
        int64_t *e = g->edge[d] = xmalloc(sizeof *e * (2 * (size_t)c->np + 2));
        int n = 0;
        e[n++] = 0;
        e[n++] = c->gshape.d[d];
        for (int k = 0; k < c->np; k++) {
            e[n++] = c->pieces[k].start[d];
            e[n++] = c->pieces[k].start[d] + c->pieces[k].shape[d];
        }
        qsort(e, (size_t)n, sizeof *e, cmp_i64);
        int u = 0;
        for (int i = 0; i < n; i++)
            if (!u || e[i] != e[u - 1]) e[u++] = e[i];
        g->ne[d] = u;
        if (u - 1 > (8 * (int64_t)c->np + 8) / g->cells) return false;
        g->cells *= u - 1;
    }
    g->owner = xmalloc(sizeof *g->owner * (size_t)g->cells);
    for (int64_t i = 0; i < g->cells; i++) g->owner[i] = -1;
    return true;
}

/* Where v sits among edges e[0..n) (it is one of them). */
static int edge_index(const int64_t *e, int n, int64_t v) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (e[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first element of cell `cell` of g, as coordinates into out. */
static void cell_start(const grid *g, int nd, int64_t cell, int64_t *out) {
    for (int d = nd - 1; d >= 0; d--) {
        int64_t n = g->ne[d] - 1;
        out[d] = g->edge[d][cell % n];
        cell /= n;
    }
}

/* Marks piece k's cells as its own; the cell of another piece when one is there (-1 none). */
static int64_t grid_mark(grid *g, const ckpt_tensor *c, int k) {
    int nd = c->gshape.ndim, lo[MS_MAX_DIMS], hi[MS_MAX_DIMS], idx[MS_MAX_DIMS];
    const ckpt_piece *p = &c->pieces[k];
    for (int d = 0; d < nd; d++) {
        lo[d] = idx[d] = edge_index(g->edge[d], g->ne[d], p->start[d]);
        hi[d] = edge_index(g->edge[d], g->ne[d], p->start[d] + p->shape[d]);
    }
    for (;;) { /* an odometer over the piece's cells (pieces are never empty) */
        int64_t cell = 0;
        for (int d = 0; d < nd; d++) cell = cell * (g->ne[d] - 1) + idx[d];
        if (g->owner[cell] >= 0) return cell;
        g->owner[cell] = k;
        int d = nd - 1;
        while (d >= 0 && ++idx[d] == hi[d]) idx[d] = lo[d], d--;
        if (d < 0) return -1;
    }
}

/* That c's pieces tile its shape exactly: every element in exactly one piece (each piece is
 * inside the shape already). A loader that counted elements would take a piece shifted onto
 * its neighbour (one row twice, one never) for a whole tensor. */
static ms_status check_coverage(const reader *r, const ckpt_tensor *c) {
    int nd = c->gshape.ndim;
    char what[256], a[400], b[400], at[128];
    int64_t first[MS_MAX_DIMS];
    if (box_numel(nd, c->gshape.d, 1) == 0) return MS_OK; /* no elements: no pieces either */
    grid g = {0};
    ms_status st = MS_OK;
    if (!grid_build(c, &g)) {
        st = ms_fail(r->err, MS_ERR_INVALID,
                     "checkpoint %s: %s: its %d pieces do not tile its shape %s (their edges cut "
                     "it into far more boxes than pieces); meta.json is corrupt (restore it, or "
                     "resume from another checkpoint)",
                     r->path, tensor_str(c, what, sizeof what), c->np,
                     ms_shape_str(c->gshape.d, nd, at, sizeof at));
        grid_free(&g);
        return st;
    }
    for (int k = 0; k < c->np && st == MS_OK; k++) {
        int64_t cell = grid_mark(&g, c, k);
        if (cell < 0) continue;
        cell_start(&g, nd, cell, first);
        st = ms_fail(r->err, MS_ERR_INVALID,
                     "checkpoint %s: %s: %s and %s overlap (both hold element %s); each element "
                     "is in exactly one piece: meta.json is corrupt (restore it, or resume from "
                     "another checkpoint)",
                     r->path, tensor_str(c, what, sizeof what),
                     piece_str(c, g.owner[cell], a, sizeof a), piece_str(c, k, b, sizeof b),
                     ms_shape_str(first, nd, at, sizeof at));
    }
    for (int64_t cell = 0; cell < g.cells && st == MS_OK; cell++) {
        if (g.owner[cell] >= 0) continue;
        cell_start(&g, nd, cell, first);
        st = ms_fail(r->err, MS_ERR_INVALID,
                     "checkpoint %s: %s: element %s is in none of its %d pieces (a gap); "
                     "meta.json is corrupt (restore it, or resume from another checkpoint)",
                     r->path, tensor_str(c, what, sizeof what),
                     ms_shape_str(first, nd, at, sizeof at), c->np);
    }
    grid_free(&g);
    return st;
}

/* --- what meta.json says as a whole ------------------------------------------------------- */

/* That the pieces meta.json puts in each file fit in its size, at the fewest bytes an element
 * can be stored in (BF16's 2: a file whose dtype disagrees with meta.json's is refused as
 * such when it is read): memory sized by a tensor's shape is then bounded by the files'
 * sizes, which are checked against the files before it is allocated. */
static ms_status check_file_room(const reader *r, const ckpt_meta *m) {
    uint64_t *used = xcalloc((size_t)m->nfiles + 1, sizeof *used);
    ms_status st = MS_OK;
    for (int i = 0; i < m->nt && st == MS_OK; i++) {
        const ckpt_tensor *c = &m->t[i];
        for (int k = 0; k < c->np && st == MS_OK; k++) {
            const ckpt_file *f = file_of(m, c->pieces[k].writer);
            size_t at = (size_t)(f - m->files);
            size_t esize = ms_dtype_size(MS_BF16);
            uint64_t need = (uint64_t)box_numel(c->gshape.ndim, c->pieces[k].shape, esize) * esize;
            if (need <= f->bytes && used[at] <= f->bytes - need) {
                used[at] += need;
                continue;
            }
            char name[64], what[256], box[400];
            ckpt_file_name(f->rank, name, sizeof name);
            st = ms_fail(r->err, MS_ERR_INVALID,
                         "checkpoint %s: %s: %s does not fit in %s, %" PRIu64
                         " bytes with its other pieces; meta.json does not describe the files",
                         r->path, tensor_str(c, what, sizeof what),
                         piece_str(c, k, box, sizeof box), name, f->bytes);
        }
    }
    free(used);
    return st;
}

static int cmp_tensor(const void *a, const void *b) {
    const ckpt_tensor *x = *(const ckpt_tensor *const *)a, *y = *(const ckpt_tensor *const *)b;
    if (x->kind != y->kind) return (x->kind > y->kind) - (x->kind < y->kind);
    return strcmp(x->name, y->name);
}

/* That no tensor is listed twice (a loader would take the first and never see the other). */
static ms_status check_unique_tensors(const reader *r, const ckpt_meta *m) {
    const ckpt_tensor **by = xmalloc(sizeof *by * ((size_t)m->nt + 1));
    for (int i = 0; i < m->nt; i++) by[i] = &m->t[i];
    qsort(by, (size_t)m->nt, sizeof *by, cmp_tensor);
    ms_status st = MS_OK;
    for (int i = 1; i < m->nt && st == MS_OK; i++)
        if (!cmp_tensor(&by[i - 1], &by[i])) {
            char what[256];
            st = ms_fail(r->err, MS_ERR_INVALID, "checkpoint %s: %s is listed twice", r->path,
                         tensor_str(by[i], what, sizeof what));
        }
    free(by);
    return st;
}

static ms_status read_files(const reader *r, const cJSON *files, ckpt_meta *m) {
    m->files = xcalloc((size_t)cJSON_GetArraySize(files) + 1, sizeof *m->files);
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        int64_t rank, bytes, crc;
        if (!get_int(f, "rank", 0, 1 << 20, &rank) ||
            !get_int(f, "bytes", 0, INT64_C(1) << 50, &bytes) ||
            !get_int(f, "crc32", 0, UINT32_MAX, &crc))
            return bad(r, "a file entry lacks rank, bytes or crc32");
        if (rank >= m->info.world)
            return ms_fail(r->err, MS_ERR_INVALID,
                           "checkpoint %s: a file of rank %lld, but %d ranks saved it; "
                           "meta.json is corrupt",
                           r->path, (long long)rank, m->info.world);
        m->files[m->nfiles++] =
            (ckpt_file){.rank = (int)rank, .bytes = (uint64_t)bytes, .crc = (uint32_t)crc};
    }
    /* sorted for lookups; a rank listed twice would leave a loader to pick one */
    qsort(m->files, (size_t)m->nfiles, sizeof *m->files, cmp_file);
    for (int i = 1; i < m->nfiles; i++)
        if (m->files[i].rank == m->files[i - 1].rank)
            return ms_fail(r->err, MS_ERR_INVALID,
                           "checkpoint %s: the file of rank %d is listed twice; meta.json is "
                           "corrupt",
                           r->path, m->files[i].rank);
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
    MS_CHECK(read_files(r, files, m));
    m->t = xcalloc((size_t)cJSON_GetArraySize(ts) + 1, sizeof *m->t);
    const cJSON *o;
    cJSON_ArrayForEach(o, ts) {
        ms_status st = read_tensor(r, o, m, &m->t[m->nt]);
        m->nt++; /* what it holds is freed with the rest */
        MS_CHECK(st);
        MS_CHECK(check_coverage(r, &m->t[m->nt - 1]));
    }
    MS_CHECK(check_unique_tensors(r, m));
    return check_file_room(r, m);
}

ms_status ckpt_meta_parse(const char *text, size_t len, const char *name, ckpt_meta *m,
                          ms_error *err) {
    memset(m, 0, sizeof *m);
    cJSON *j = cJSON_ParseWithLength(text, len);
    reader r = {.path = name, .err = err};
    ms_status st = j ? parse_meta(&r, j, m) : bad(&r, "meta.json is not valid JSON");
    cJSON_Delete(j);
    if (st != MS_OK) ckpt_meta_free(m);
    return st;
}

ms_status ckpt_meta_read(const char *step_dir, ckpt_meta *m, ms_error *err) {
    memset(m, 0, sizeof *m);
    char path[1100];
    snprintf(path, sizeof path, "%s/meta.json", step_dir);
    uint8_t *text = NULL;
    size_t len = 0;
    MS_CHECK(ms_read_file(path, CKPT_META_MAX, &text, &len, err));
    ms_status st = ckpt_meta_parse((const char *)text, len, path, m, err);
    free(text);
    if (st != MS_OK) return st;
    snprintf(m->info.path, sizeof m->info.path, "%s", step_dir);
    return MS_OK;
}

ms_status ckpt_resolve(const char *dir, char *step_dir, size_t len, ms_error *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/latest", dir);
    struct stat sb;
    if (lstat(path, &sb) == 0) { /* it names the checkpoint, or cannot be read: said so */
        uint8_t *text = NULL;
        size_t n = 0;
        ms_status st = ms_read_file(path, 256, &text, &n, err);
        if (st != MS_OK) return ms_fail_wrap(err, st, "checkpoint");
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

/* CRC-32 of the next n bytes of fd. */
static ms_status crc_of(int fd, uint64_t n, const char *path, uint32_t *crc, ms_error *err) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = xmalloc(CHUNK);
    uLong c = crc32(0L, Z_NULL, 0);
    ms_status st = MS_OK;
    for (uint64_t done = 0; done < n && st == MS_OK;) {
        size_t k = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        st = ms_read_exact(fd, buf, k, path, err);
        if (st == MS_OK) c = crc32(c, buf, (uInt)k);
        done += k;
    }
    free(buf);
    *crc = (uint32_t)c;
    return st;
}

ms_status ckpt_file_sum(const char *path, uint64_t *bytes, uint32_t *crc, ms_error *err) {
    int fd;
    *bytes = 0;
    *crc = 0;
    if (ms_open_regular(path, &fd, bytes, err) != MS_OK)
        return ms_fail_wrap(err, MS_ERR_IO, "checkpoint");
    ms_status st = crc_of(fd, *bytes, path, crc, err);
    close(fd);
    return st;
}

/* Opens file f of a checkpoint: a regular file (a FIFO or a device in its place would block
 * or never end) of the size meta.json gives. */
static ms_status open_shard(const char *step_dir, const ckpt_file *f, char *path, size_t len,
                            int *fd, ms_error *err) {
    char name[64];
    ckpt_file_name(f->rank, name, sizeof name);
    snprintf(path, len, "%s/%s", step_dir, name);
    struct stat sb;
    if (stat(path, &sb) != 0) /* stat opens nothing: safe on anything */
        return ms_fail(err, MS_ERR_INVALID, "checkpoint %s: the shard %s is missing", step_dir,
                       name);
    uint64_t size;
    ms_status st = ms_open_regular(path, fd, &size, err);
    if (st != MS_OK) {
        char why[MS_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        return ms_fail(err, MS_ERR_INVALID,
                       "checkpoint %s: %s; a shard is a regular file (restore it, or resume from "
                       "another checkpoint)",
                       step_dir, why);
    }
    if (size != f->bytes) {
        close(*fd);
        *fd = -1;
        return ms_fail(err, MS_ERR_INVALID,
                       "checkpoint %s: %s is %" PRIu64 " bytes, meta.json says %" PRIu64
                       " (truncated or replaced)",
                       step_dir, name, size, f->bytes);
    }
    return MS_OK;
}

ms_status ckpt_file_check(const char *step_dir, const ckpt_file *f, ms_error *err) {
    char path[1200];
    int fd;
    MS_CHECK(open_shard(step_dir, f, path, sizeof path, &fd, err));
    uint32_t crc;
    ms_status st = crc_of(fd, f->bytes, path, &crc, err); /* the size meta.json gives, no more */
    close(fd);
    MS_CHECK(st);
    if (crc != f->crc) {
        char name[64];
        ckpt_file_name(f->rank, name, sizeof name);
        return ms_fail(err, MS_ERR_INVALID,
                       "checkpoint %s: %s has CRC-32 %08x, meta.json says %08x (corrupt)", step_dir,
                       name, crc, f->crc);
    }
    return MS_OK;
}

ms_status ckpt_files_sized(const char *step_dir, const ckpt_meta *m, ms_error *err) {
    for (int i = 0; i < m->nfiles; i++) {
        char path[1200];
        int fd;
        MS_CHECK(open_shard(step_dir, &m->files[i], path, sizeof path, &fd, err));
        close(fd);
    }
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

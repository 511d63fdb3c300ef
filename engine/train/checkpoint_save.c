/* checkpoint_save.c - saving a distributed checkpoint in the background (see checkpoint.h).
 *
 * The step boundary only copies this rank's boxes into host buffers; the rank's writer
 * thread writes them as rank-R.safetensors into the temporary folder, reads the file back
 * for its size and CRC-32 and leaves them in rank-R.sum. Rank 0 commits once every rank's
 * writer is done: meta.json from the plan and the sums, rename of the folder, `latest`,
 * pruning. Every step of that is durable (fsync of files and folders) so that a crash
 * anywhere leaves the previous checkpoint and `latest` intact.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "engine/io/fileio.h"
#include "engine/io/safetensors.h"
#include "engine/train/checkpoint_internal.h"

struct ms_ckpt_saver {
    ms_ctx *ctx;
    char *dir, *model;
    int keep;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;
    /* the save in flight (the same on every rank: handed at the same step) */
    bool in_flight;
    bool handed, done, failed; /* under mu */
    char why[MS_ERROR_MSG_MAX];
    ckpt_meta plan; /* every piece (rank 0 writes meta.json from it) */
    ms_st_entry *e; /* this rank's pieces, pointing into pool */
    int ne;
    float *pool; /* host copies of this rank's pieces, kept from save to save */
    size_t pool_floats;
    char tmp[1100], final[1100];
    int64_t handed_ns;
    double bytes;   /* rank 0 at commit: all files */
    double write_s; /* rank 0 at commit: the slowest rank's write of its file */
    ms_strbuf held; /* what saves finished inside ms_ckpt_saver_save said, for the next poll */
};

/* The most one save has to say: a commit names its folder (up to 1100 bytes). */
#define NOTE_MAX (1200 + MS_ERROR_MSG_MAX)

/* --- folders ------------------------------------------------------------------------------- */

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static void remove_tree(const char *path) {
    nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static ms_status fsync_dir(const char *path, ms_error *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return ms_fail(err, MS_ERR_IO, "checkpoint: cannot sync the folder %s: %s", path,
                       strerror(e));
    }
    close(fd);
    return MS_OK;
}

static ms_status make_dir(const char *path, ms_error *err) {
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return MS_OK;
    return ms_fail(err, MS_ERR_IO,
                   "checkpoint: cannot create the folder %s: %s (choose another --save-dir)", path,
                   strerror(errno));
}

/* Removes temporary folders that a killed save left behind (rank 0, at start). */
static void remove_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, ".tmp-step-", 10) || !strncmp(de->d_name, ".old-step-", 10)) {
            char path[1400];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            remove_tree(path);
        }
    closedir(d);
}

static int by_name_desc(const void *a, const void *b) {
    return strcmp(*(char *const *)b, *(char *const *)a);
}

/* Removes complete checkpoints beyond the newest `keep` (never the one `latest` names). */
static void prune(const char *dir, int keep, const char *latest) {
    DIR *d = opendir(dir);
    if (!d) return;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "step-", 5)) {
            if (n == cap)
                names = xrealloc(names, sizeof *names * (size_t)(cap = cap ? 2 * cap : 16));
            names[n++] = xstrdup(de->d_name);
        }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name_desc);
    for (int i = 0; i < n; i++) {
        if (i >= keep && strcmp(names[i], latest)) {
            char path[1400];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            remove_tree(path);
        }
        free(names[i]);
    }
    free(names);
}

/* --- the writer thread --------------------------------------------------------------------- */

static ms_status write_sum(FILE *f, void *arg, ms_error *err) {
    const char *line = arg;
    return ms_durable_fwrite(f, line, strlen(line), "rank sum", err);
}

/* Writes this rank's file and its sum; runs on the writer thread without the lock. */
static ms_status write_shard(ms_ckpt_saver *s, ms_error *err) {
    if (s->ne == 0) return MS_OK; /* this rank holds only boxes that others write */
    char name[64], path[1200], sum[1200];
    ckpt_file_name(s->ctx->rank, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", s->tmp, name);
    ms_st_kv meta[1] = {{"producer", "meshscope"}};
    int64_t t0 = ms_now_ns();
    MS_CHECK(ms_safetensors_write(path, s->e, s->ne, meta, 1, err));
    double secs = (ms_now_ns() - t0) / 1e9;
    uint64_t bytes;
    uint32_t crc;
    MS_CHECK(ckpt_file_sum(path, &bytes, &crc, err));
    char line[96];
    snprintf(line, sizeof line, "%" PRIu64 " %u %.6f\n", bytes, crc, secs);
    snprintf(sum, sizeof sum, "%s/rank-%05d.sum", s->tmp, s->ctx->rank);
    return ms_write_file_durable(sum, write_sum, line, err);
}

static void *writer_main(void *arg) {
    ms_ckpt_saver *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && !(s->handed && !s->done)) pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit) break;
        pthread_mutex_unlock(&s->mu);
        ms_error e = {0};
        ms_status st = write_shard(s, &e);
        pthread_mutex_lock(&s->mu);
        s->failed = st != MS_OK;
        if (st != MS_OK) snprintf(s->why, sizeof s->why, "%s", e.msg);
        s->done = true;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* --- the API ------------------------------------------------------------------------------- */

ms_status ms_ckpt_saver_create(ms_ctx *ctx, const ms_ckpt_opts *o, ms_ckpt_saver **out,
                               ms_error *err) {
    *out = NULL;
    if (!o->dir || !*o->dir) return ms_fail(err, MS_ERR_INVALID, "checkpoint: no folder given");
    ms_status mine = make_dir(o->dir, err);
    if (mine == MS_OK) {
        char probe[1200];
        snprintf(probe, sizeof probe, "%s/.probe-%d-%d", o->dir, (int)getpid(), ctx->rank);
        int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0)
            mine = ms_fail(err, MS_ERR_IO,
                           "checkpoint: cannot write in %s: %s (choose another --save-dir)", o->dir,
                           strerror(errno));
        else
            close(fd), unlink(probe);
    }
    if (mine == MS_OK && ctx->rank == 0) remove_stale(o->dir);
    /* Every rank waits for that removal (a rank that saved at once could lose its fresh
     * shard to it) and learns whether all can write, so none goes on alone. */
    float bad = mine != MS_OK ? 1.0f : 0.0f, any = 0;
    MS_CHECK(ms_all_reduce(ctx->world, &bad, &any, 1, MS_REDUCE_MAX, err));
    if (mine != MS_OK) return mine;
    if (any > 0)
        return ms_fail(err, MS_ERR_IO,
                       "checkpoint: another rank cannot write in %s (see its message; choose "
                       "another --save-dir)",
                       o->dir);
    ms_ckpt_saver *s = xcalloc(1, sizeof *s);
    s->ctx = ctx;
    s->dir = xstrdup(o->dir);
    s->model = xstrdup(o->model ? o->model : "");
    s->keep = o->keep > 0 ? o->keep : 3;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s->dir), free(s->model), free(s);
        return ms_fail(err, MS_ERR_NOMEM, "checkpoint: cannot start the writer thread");
    }
    *out = s;
    return MS_OK;
}

static void drop_copies(ms_ckpt_saver *s) {
    free(s->e);
    s->e = NULL;
    s->ne = 0;
    ckpt_meta_free(&s->plan);
}

/* The floats of this rank's pieces under plan m. */
static size_t own_floats(const ms_ckpt_saver *s, ms_trainer *t, const ckpt_meta *m) {
    size_t n = 0;
    for (int i = 0; i < m->nt; i++)
        for (int k = 0; k < m->t[i].np; k++)
            if (m->t[i].pieces[k].writer == s->ctx->rank) {
                ms_state_tensor st;
                ms_trainer_state(t, m->t[i].state_index, &st);
                n += st.n;
            }
    return n;
}

/* Grows the host buffer to n floats, touching every page: a save's stall is then the copy
 * alone, not the page faults of fresh memory (they made the first saves 10x slower). */
static void reserve_pool(ms_ckpt_saver *s, size_t n) {
    if (n <= s->pool_floats) return;
    free(s->pool);
    s->pool = xmalloc(sizeof(float) * n);
    memset(s->pool, 0, sizeof(float) * n);
    s->pool_floats = n;
}

void ms_ckpt_saver_prepare(ms_ckpt_saver *s, ms_trainer *t) {
    ckpt_meta m;
    ckpt_plan(t, &m);
    reserve_pool(s, own_floats(s, t, &m));
    ckpt_meta_free(&m);
}

/* This rank's pieces of the plan, copied out of the trainer into the host buffer (from the
 * rank's device where the state lives there). */
static ms_status copy_pieces(ms_ckpt_saver *s, ms_trainer *t, ms_error *err) {
    int cap = 0;
    for (int i = 0; i < s->plan.nt; i++) cap += s->plan.t[i].np;
    s->e = xcalloc((size_t)(cap ? cap : 1), sizeof *s->e);
    reserve_pool(s, own_floats(s, t, &s->plan));
    size_t at = 0;
    for (int i = 0; i < s->plan.nt; i++) {
        const ckpt_tensor *c = &s->plan.t[i];
        for (int k = 0; k < c->np; k++) {
            if (c->pieces[k].writer != s->ctx->rank) continue;
            ms_state_tensor st;
            ms_trainer_state(t, c->state_index, &st);
            float *copy = s->pool + at;
            MS_CHECK(ms_device_move(s->ctx->device, copy, st.local, sizeof(float) * st.n, err));
            at += st.n;
            ms_st_entry *e = &s->e[s->ne++];
            *e = (ms_st_entry){
                .name = c->pieces[k].key, .dtype = MS_F32, .ndim = c->gshape.ndim, .data = copy};
            memcpy(e->shape, c->pieces[k].shape, sizeof e->shape);
        }
    }
    return MS_OK;
}

/* Keeps a note for the next poll, one line each. */
static void hold(ms_ckpt_saver *s, const char *note) {
    if (*note) ms_strbuf_printf(&s->held, "%s%s", s->held.len ? "\n" : "", note);
}

static ms_status finish(ms_ckpt_saver *s, bool wait, char *note, size_t note_len, ms_error *err);

ms_status ms_ckpt_saver_save(ms_ckpt_saver *s, ms_trainer *t, double *stall_s, ms_error *err) {
    int64_t t0 = ms_now_ns();
    char note[NOTE_MAX];
    MS_CHECK(finish(s, true, note, sizeof note, err));
    hold(s, note); /* a commit made here is reported by the next poll, not lost */
    MS_CHECK(ms_trainer_settle(t, err)); /* offload: the last host update onto the device */
    ckpt_plan(t, &s->plan);
    const ms_train_opts *o = ms_trainer_opts(t);
    ms_ckpt_info *in = &s->plan.info;
    in->step = ms_trainer_step_index(t);
    in->skipped = ms_trainer_skipped(t);
    in->world = s->ctx->world_size;
    in->seed = o->seed;
    in->batch = o->batch, in->seq = o->seq, in->steps = o->steps;
    /* the strategy this state is laid out under now: a live switch changes it */
    ms_strategy_short_json(ms_trainer_strategy(t), in->strategy, sizeof in->strategy);
    snprintf(in->model, sizeof in->model, "%s", s->model);
    snprintf(s->tmp, sizeof s->tmp, "%s/.tmp-step-%08lld", s->dir, (long long)in->step);
    snprintf(s->final, sizeof s->final, "%s/step-%08lld", s->dir, (long long)in->step);
    ms_error e = {0};
    /* A copy that fails fails this rank's part, as a folder that cannot be made does. */
    ms_status made = copy_pieces(s, t, &e);
    if (made == MS_OK) made = make_dir(s->tmp, &e);
    pthread_mutex_lock(&s->mu);
    s->in_flight = true;
    s->done = made != MS_OK; /* this rank's part failed at once */
    s->failed = made != MS_OK;
    if (made != MS_OK) snprintf(s->why, sizeof s->why, "%s", e.msg);
    s->handed = true;
    s->bytes = s->write_s = 0;
    s->handed_ns = ms_now_ns();
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (stall_s) *stall_s = (ms_now_ns() - t0) / 1e9;
    return MS_OK;
}

/* Rank 0: meta.json, the rename, `latest` and pruning. */
static ms_status commit(ms_ckpt_saver *s, ms_error *err) {
    ckpt_meta *m = &s->plan;
    m->files = xcalloc((size_t)m->info.world + 1, sizeof *m->files);
    m->nfiles = 0;
    for (int r = 0; r < m->info.world; r++) {
        bool writes = false;
        for (int i = 0; i < m->nt && !writes; i++)
            for (int k = 0; k < m->t[i].np && !writes; k++) writes = m->t[i].pieces[k].writer == r;
        if (!writes) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s/rank-%05d.sum", s->tmp, r);
        uint8_t *text = NULL;
        size_t len = 0;
        MS_CHECK(ms_read_file(path, 256, &text, &len, err));
        ckpt_file *f = &m->files[m->nfiles++];
        f->rank = r;
        double secs = 0;
        int got = sscanf((char *)text, "%" SCNu64 " %" SCNu32 " %lf", &f->bytes, &f->crc, &secs);
        free(text);
        if (got != 3) return ms_fail(err, MS_ERR_IO, "checkpoint: a corrupt %s", path);
        s->bytes += (double)f->bytes;
        if (secs > s->write_s) s->write_s = secs;
        unlink(path);
    }
    char meta[1200];
    snprintf(meta, sizeof meta, "%s/meta.json", s->tmp);
    MS_CHECK(ckpt_meta_write(meta, m, err));
    MS_CHECK(fsync_dir(s->tmp, err));
    /* A checkpoint of the same step (a resumed run saving again) moves aside first, so that
     * `latest` never names a missing folder. */
    char old[1200] = "";
    if (access(s->final, F_OK) == 0) {
        snprintf(old, sizeof old, "%s/.old-step-%08lld", s->dir, (long long)m->info.step);
        remove_tree(old);
        if (rename(s->final, old) != 0)
            return ms_fail(err, MS_ERR_IO, "checkpoint: cannot move %s aside: %s", s->final,
                           strerror(errno));
    }
    if (rename(s->tmp, s->final) != 0)
        return ms_fail(err, MS_ERR_IO, "checkpoint: cannot rename %s to %s: %s", s->tmp, s->final,
                       strerror(errno));
    MS_CHECK(fsync_dir(s->dir, err));
    char latest[1200], name[64];
    snprintf(latest, sizeof latest, "%s/latest", s->dir);
    snprintf(name, sizeof name, "step-%08lld\n", (long long)m->info.step);
    MS_CHECK(ms_write_file_durable(latest, write_sum, name, err));
    if (*old) remove_tree(old);
    name[strlen(name) - 1] = '\0';
    prune(s->dir, s->keep, name);
    return MS_OK;
}

/* Commits (or abandons) the save in flight once every rank's writer is done; *note says what
 * happened to it (see ms_ckpt_saver_poll). */
static ms_status finish(ms_ckpt_saver *s, bool wait, char *note, size_t note_len, ms_error *err) {
    if (note && note_len) note[0] = '\0';
    if (!s || !s->in_flight) return MS_OK;
    pthread_mutex_lock(&s->mu);
    while (wait && !s->done) pthread_cond_wait(&s->cv, &s->mu);
    float mine[2] = {s->done ? 0.0f : 1.0f, s->failed ? 1.0f : 0.0f}, all[2];
    pthread_mutex_unlock(&s->mu);
    MS_CHECK(ms_all_reduce(s->ctx->world, mine, all, 2, MS_REDUCE_MAX, err));
    if (all[0] > 0) return MS_OK; /* some rank is still writing */
    pthread_mutex_lock(&s->mu);
    s->handed = false;
    pthread_mutex_unlock(&s->mu);
    s->in_flight = false;
    ms_error e = {0};
    ms_status st = all[1] > 0 ? MS_ERR_IO : MS_OK;
    if (st == MS_OK && s->ctx->rank == 0) st = commit(s, &e);
    /* At the end of a run every rank returns after the commit, so that whatever follows (a
     * load, another process reading `latest`) finds it; mid-run the others need not wait. */
    if (wait && all[1] == 0) {
        float failed = st != MS_OK ? 1.0f : 0.0f, any;
        MS_CHECK(ms_all_reduce(s->ctx->world, &failed, &any, 1, MS_REDUCE_MAX, err));
        if (any > 0 && st == MS_OK) st = MS_ERR_IO;
    }
    if (st != MS_OK && note) {
        if (mine[1] > 0)
            snprintf(note, note_len, "checkpoint at step %lld not saved: %s",
                     (long long)s->plan.info.step, s->why);
        else if (s->ctx->rank == 0)
            snprintf(note, note_len, "checkpoint at step %lld not saved: %s",
                     (long long)s->plan.info.step,
                     *e.msg ? e.msg : "another rank could not write its shard (see its message)");
    }
    if (st != MS_OK && s->ctx->rank == 0) remove_tree(s->tmp);
    if (st == MS_OK && s->ctx->rank == 0 && note)
        snprintf(note, note_len,
                 "checkpoint %s committed: %lld tensors, %.1f MiB written in %.1f ms by the "
                 "slowest rank (%.0f MB/s in all), %.1f ms after the copy",
                 s->final, (long long)s->plan.nt, s->bytes / 1048576.0, s->write_s * 1e3,
                 s->write_s > 0 ? s->bytes / s->write_s / 1e6 : 0.0,
                 (ms_now_ns() - s->handed_ns) / 1e6);
    drop_copies(s);
    return MS_OK;
}

ms_status ms_ckpt_saver_poll(ms_ckpt_saver *s, bool wait, char *note, size_t note_len,
                             ms_error *err) {
    if (note && note_len) note[0] = '\0';
    if (!s) return MS_OK;
    char now[NOTE_MAX];
    MS_CHECK(finish(s, wait, now, sizeof now, err));
    hold(s, now);
    if (note && note_len && s->held.len) snprintf(note, note_len, "%s", s->held.p);
    s->held.len = 0;
    if (s->held.p) s->held.p[0] = '\0';
    return MS_OK;
}

void ms_ckpt_saver_destroy(ms_ckpt_saver *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    while (s->handed && !s->done) pthread_cond_wait(&s->cv, &s->mu);
    s->quit = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    drop_copies(s);
    free(s->pool);
    free(s->held.p);
    free(s->dir), free(s->model);
    free(s);
}

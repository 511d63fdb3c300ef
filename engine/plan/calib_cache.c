/* calib_cache.c - the cpu-local cache: its key, the quiet check before measuring, provenance
 * (calib_cache.h). The measurement itself is calibrate.c. */
#include "engine/plan/calib_cache.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/xalloc.h"
#include "engine/io/fileio.h"
#include "engine/kernels/blas.h"

/* The CPU features whose presence changes what the kernels (and OpenBLAS's) run. */
static const char *const key_features[] = {"avx2", "avx512f", "avx512_bf16", "amx_tile",
                                           "amx_bf16"};

/* --- texts from /proc ------------------------------------------------------------------------ */

/* The first `cap - 1` bytes of a file (a /proc file reports no size, so it is read, not
 * stat'ed); false when it cannot be opened. What matters of /proc/stat and /proc/cpuinfo comes
 * first (the cpu lines, the first processor's block). */
static bool read_head(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = 0, got;
    while (n + 1 < cap && (got = fread(buf + n, 1, cap - 1 - n, f)) > 0) n += got;
    buf[n] = '\0';
    fclose(f);
    return true;
}

void ms_cpu_features(const char *cpuinfo, char *buf, size_t len) {
    snprintf(buf, len, "none");
    const char *line = cpuinfo;
    while (line && *line && strncmp(line, "flags", 5) != 0) {
        line = strchr(line, '\n');
        if (line) line++;
    }
    const char *colon = line && *line ? strchr(line, ':') : NULL;
    const char *eol = colon ? strchr(colon, '\n') : NULL;
    if (!colon) return;
    if (!eol) eol = colon + strlen(colon);
    size_t n = 0;
    for (size_t i = 0; i < sizeof key_features / sizeof *key_features; i++) {
        size_t fl = strlen(key_features[i]);
        bool found = false;
        for (const char *p = colon + 1; p < eol && !found;) {
            while (p < eol && *p == ' ') p++;
            size_t w = strcspn(p, " \n");
            found = w == fl && !strncmp(p, key_features[i], fl);
            p += w;
        }
        if (found && n < len)
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? " " : "", key_features[i]);
    }
}

/* The aggregate "cpu " line of a /proc/stat text: busy and total jiffies; the cpuN lines'
 * count in *cpus. */
static bool stat_totals(const char *text, double *busy, double *total, int *cpus) {
    bool found = false;
    *cpus = 0;
    for (const char *line = text; line && *line;) {
        if (!strncmp(line, "cpu ", 4)) {
            /* user nice system idle iowait irq softirq steal (guest time is inside user) */
            unsigned long long v[8] = {0};
            int n = sscanf(line + 4, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                           &v[3], &v[4], &v[5], &v[6], &v[7]);
            if (n < 4) return false;
            double t = 0;
            for (int i = 0; i < n; i++) t += (double)v[i];
            *total = t;
            *busy = t - (double)v[3] - (double)v[4];
            found = true;
        } else if (!strncmp(line, "cpu", 3) && line[3] >= '0' && line[3] <= '9') {
            (*cpus)++;
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return found;
}

bool ms_cpu_busy_between(const char *before, const char *after, double *busy_cores) {
    double b0, t0, b1, t1;
    int c0, c1;
    if (!stat_totals(before, &b0, &t0, &c0) || !stat_totals(after, &b1, &t1, &c1)) return false;
    if (!(t1 > t0) || c1 < 1) return false;
    double share = (b1 - b0) / (t1 - t0);
    *busy_cores = (share < 0 ? 0 : share > 1 ? 1 : share) * c1;
    return true;
}

#define STAT_HEAD (256u << 10)

bool ms_cpu_busy_sample(double window_s, double *busy_cores) {
    char *a = xmalloc(STAT_HEAD), *b = xmalloc(STAT_HEAD);
    bool ok = read_head("/proc/stat", a, STAT_HEAD);
    if (ok) {
        struct timespec ts = {(time_t)window_s, (long)((window_s - floor(window_s)) * 1e9)};
        nanosleep(&ts, NULL);
        ok = read_head("/proc/stat", b, STAT_HEAD) && ms_cpu_busy_between(a, b, busy_cores);
    }
    free(a);
    free(b);
    return ok;
}

void ms_cluster_cpu_model(char *buf, size_t len) {
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *p = strchr(line, ':');
        if (!p) break;
        p++;
        while (*p == ' ') p++;
        snprintf(buf, len, "%s", p);
        size_t n = strlen(buf);
        while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = '\0';
        break;
    }
    fclose(f);
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* --- the key --------------------------------------------------------------------------------- */

/* An AddressSanitizer build runs every kernel several times slower: its rates are its own, so
 * its cache is too (a ThreadSanitizer build differs in its threads already). */
static const char *build_part(void) {
#if defined(__SANITIZE_ADDRESS__)
    return "; build=AddressSanitizer";
#else
    return "";
#endif
}

/* A key part's value never holds the parts' separator. */
static void no_separator(char *s) {
    for (; *s; s++)
        if (*s == ';') *s = ',';
}

void ms_calib_key(char *buf, size_t len) {
    char model[96], features[96], blas[256];
    ms_cluster_cpu_model(model, sizeof model);
    char *info = xmalloc(64u << 10);
    if (read_head("/proc/cpuinfo", info, 64u << 10))
        ms_cpu_features(info, features, sizeof features);
    else
        snprintf(features, sizeof features, "unknown");
    free(info);
    ms_blas_describe(blas, sizeof blas);
    no_separator(model);
    no_separator(blas);
    /* The calibration runs one BLAS thread per worker and two for the two-thread speedup,
     * whatever MS_BLAS_THREADS or run --threads say (the planner applies a job's threads per
     * rank itself); only a ThreadSanitizer build pins it to one, and its speedup reads 1. */
    const char *threads = ms_blas_pinned_for_tsan() ? "1 per worker, pinned (ThreadSanitizer)"
                                                    : "1 per worker, 2 for the speedup";
    snprintf(buf, len, "model=%s; features=%s; cores=%d; blas=%s; threads=%s%s", model, features,
             online_cores(), blas, threads, build_part());
}

void ms_calib_key_hash(const char *key, char *out) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 16777619u;
    snprintf(out, 9, "%08x", (unsigned)h);
}

/* The value of part `name` in key (length in *n), or NULL. */
static const char *key_part(const char *key, const char *name, size_t nl, size_t *n) {
    for (const char *p = key; p && *p;) {
        size_t w = strcspn(p, ";");
        if (w > nl && p[nl] == '=' && !strncmp(p, name, nl)) {
            *n = w - nl - 1;
            return p + nl + 1;
        }
        p += w;
        while (*p == ';' || *p == ' ') p++;
    }
    return NULL;
}

void ms_calib_key_diff(const char *then, const char *now, char *buf, size_t len) {
    buf[0] = '\0';
    if (!strcmp(then, now)) return;
    for (const char *p = now; *p;) {
        size_t w = strcspn(p, ";"), nl = strcspn(p, "=;"), vn = 0;
        const char *v = nl < w ? p + nl + 1 : p + w, *old = key_part(then, p, nl, &vn);
        size_t n = (size_t)(p + w - v);
        if (!old || vn != n || strncmp(old, v, n)) {
            if (old)
                snprintf(buf, len, "%.*s: '%.*s' then, '%.*s' now", (int)nl, p, (int)vn, old,
                         (int)n, v);
            else
                snprintf(buf, len, "%.*s: not recorded then, '%.*s' now", (int)nl, p, (int)n, v);
            return;
        }
        p += w;
        while (*p == ';' || *p == ' ') p++;
    }
    snprintf(buf, len, "the key then: '%s'", then); /* now's parts all match: then has more */
}

/* --- the quiet check ------------------------------------------------------------------------- */

double ms_calib_default_max_busy(int cores) {
    double share = MS_CALIB_BUSY_SHARE * cores;
    return share > MS_CALIB_BUSY_CORES ? share : MS_CALIB_BUSY_CORES;
}

/* A non-negative number from the environment, or def (a malformed value is named). */
static double env_seconds_or_cores(const char *name, double def) {
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    double v = strtod(s, &end);
    if (*end || !isfinite(v) || v < 0) {
        fprintf(stderr, "meshscope: ignoring %s=%s (want a number, 0 or more)\n", name, s);
        return def;
    }
    return v;
}

ms_calib_quiet ms_calib_quiet_limits(int cores) {
    return (ms_calib_quiet){
        .max_busy = env_seconds_or_cores("MS_CALIBRATE_MAX_BUSY", ms_calib_default_max_busy(cores)),
        .wait_s = env_seconds_or_cores("MS_CALIBRATE_WAIT_S", MS_CALIB_WAIT_S)};
}

/* Samples until the machine is quiet or q->wait_s has passed; *busy is the last sample (-1 when
 * /proc/stat cannot be read: no check, as on a system without it). True when quiet. */
static bool wait_quiet(const ms_calib_quiet *q, int cores, FILE *log, double *busy,
                       double *waited) {
    *waited = 0;
    for (;;) {
        if (!ms_cpu_busy_sample(MS_CALIB_SAMPLE_S, busy)) {
            *busy = -1;
            return true;
        }
        if (*busy <= q->max_busy) return true;
        if (*waited + 1e-9 >= q->wait_s) return false;
        if (log && *waited == 0)
            fprintf(log,
                    "cpu-local: %.2f of %d cores are busy; waiting up to %.0f s for the machine "
                    "to settle before measuring\n",
                    *busy, cores, q->wait_s);
        *waited += MS_CALIB_SAMPLE_S;
    }
}

/* --- provenance ------------------------------------------------------------------------------ */

bool ms_calib_usable(const ms_cluster *cached, const char *key, int cores, char *why, size_t len) {
    char diff[400];
    ms_calib_key_diff(cached->calibration_key, key, diff, sizeof diff);
    if (strcmp(cached->calibration, MS_CALIBRATION_VERSION))
        snprintf(why, len, "it was taken by calibration '%s', this is '%s'",
                 cached->calibration[0] ? cached->calibration : "unversioned",
                 MS_CALIBRATION_VERSION);
    else if (!cached->cpu || cached->cores != cores)
        snprintf(why, len, "it describes %d cores, this machine has %d online", cached->cores,
                 cores);
    else if (diff[0])
        snprintf(why, len, "it was measured under another key (%s)", diff);
    else
        return true;
    return false;
}

/* "3 h ago" from seconds. */
static void age_text(double s, char *buf, size_t len) {
    if (s < -60)
        snprintf(buf, len, "in the future: check the clock");
    else if (s < 120)
        snprintf(buf, len, "%.0f s ago", s < 0 ? 0 : s);
    else if (s < 7200)
        snprintf(buf, len, "%.0f min ago", s / 60);
    else if (s < 172800)
        snprintf(buf, len, "%.0f h ago", s / 3600);
    else
        snprintf(buf, len, "%.0f days ago", s / 86400);
}

void ms_calib_provenance(const ms_cluster *c, double max_busy, time_t now, char *buf, size_t len) {
    struct tm tmv = {0};
    const char *end = strptime(c->calibrated_at, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    char when[96] = "at an unknown time";
    if (end && !*end) {
        char stamp[32], age[48];
        strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M UTC", &tmv);
        age_text(difftime(now, timegm(&tmv)), age, sizeof age);
        snprintf(when, sizeof when, "%s (%s)", stamp, age);
    }
    double hi = c->busy_before > c->busy_after ? c->busy_before : c->busy_after;
    if (c->busy_before < 0 || c->busy_after < 0)
        snprintf(buf, len, "taken %s; the machine's load was not checked", when);
    else
        snprintf(buf, len, "taken %s on %s (%.2f cores busy before, %.2f after)", when,
                 hi <= max_busy ? "an idle machine" : "a busy machine", c->busy_before,
                 c->busy_after);
}

/* --- the cache ------------------------------------------------------------------------------- */

static void sanitize(char *s) {
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '-'))
            *s = '_';
}

/* The cache folder, and the file name's readable start "cpu-local-<model>-<cores>c-". */
static ms_status cache_place(char *dir, size_t dlen, char *stem, size_t slen, ms_error *err) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(dir, dlen, "%s/meshscope", xdg);
    else if (home && *home)
        snprintf(dir, dlen, "%s/.cache/meshscope", home);
    else
        return ms_fail(err, MS_ERR_IO,
                       "cpu-local: neither XDG_CACHE_HOME nor HOME is set; set one so the "
                       "calibration can be cached");
    char model[96];
    ms_cluster_cpu_model(model, sizeof model);
    sanitize(model);
    snprintf(stem, slen, "cpu-local-%s-%dc-", model, online_cores());
    return MS_OK;
}

ms_status ms_cluster_cache_path(char *buf, size_t len, ms_error *err) {
    char dir[512], stem[160], key[MS_CALIB_KEY_MAX], hash[9];
    MS_CHECK(cache_place(dir, sizeof dir, stem, sizeof stem, err));
    ms_calib_key(key, sizeof key);
    ms_calib_key_hash(key, hash);
    snprintf(buf, len, "%s/%s%s.json", dir, stem, hash);
    return MS_OK;
}

/* Why no file of this key exists: the newest file of the same model and cores names the part
 * of the key that changed ("" when there is none). */
static void other_key_note(const char *key, char *why, size_t len) {
    char dir[512], stem[160], best[1024] = "";
    why[0] = '\0';
    if (cache_place(dir, sizeof dir, stem, sizeof stem, NULL) != MS_OK) return;
    DIR *d = opendir(dir);
    if (!d) return;
    time_t newest = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, stem, strlen(stem)) || n < 5 || strcmp(e->d_name + n - 5, ".json"))
            continue;
        char path[1024];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) == 0 && sb.st_mtime >= newest) newest = sb.st_mtime, strcpy(best, path);
    }
    closedir(d);
    ms_cluster *c = xcalloc(1, sizeof *c);
    char diff[400];
    if (best[0] && ms_cluster_load(best, c, NULL) == MS_OK) {
        ms_calib_key_diff(c->calibration_key, key, diff, sizeof diff);
        if (diff[0]) snprintf(why, len, "%s was measured under another key (%s)", best, diff);
    }
    free(c);
}

/* The cached calibration at path if it stands for this machine (its provenance said); else
 * false, and why it is measured again said. */
static bool from_cache(const char *path, const char *key, int cores, FILE *log, ms_cluster *out) {
    char why[1600], line[512];
    ms_cluster *c = xcalloc(1, sizeof *c);
    ms_error e = {0};
    bool ok = false;
    if (access(path, F_OK) != 0) {
        other_key_note(key, why, sizeof why);
        if (!why[0]) snprintf(why, sizeof why, "no calibration cached for this machine yet");
    } else if (ms_cluster_load(path, c, &e) != MS_OK) {
        snprintf(why, sizeof why, "cannot use %s (%s)", path, e.msg);
    } else if (!ms_calib_usable(c, key, cores, line, sizeof line)) {
        snprintf(why, sizeof why, "%s: %s", path, line);
    } else {
        ok = true;
        *out = *c;
        ms_calib_provenance(c, ms_calib_default_max_busy(cores), time(NULL), line, sizeof line);
        if (log) fprintf(log, "cpu-local: calibration from %s, %s\n", path, line);
    }
    if (!ok && log) fprintf(log, "cpu-local: measuring this machine: %s\n", why);
    free(c);
    return ok;
}

static ms_status mkdirs(const char *path, ms_error *err) {
    char tmp[640];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(tmp, 0755);
        *p = '/';
    }
    struct stat sb;
    if (mkdir(tmp, 0755) != 0 && (stat(tmp, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        return ms_fail(err, MS_ERR_IO, "cannot create the cache folder %s", tmp);
    return MS_OK;
}

static ms_status write_text(FILE *f, void *arg, ms_error *err) {
    const char *s = arg;
    return ms_durable_fwrite(f, s, strlen(s), "cluster cache", err);
}

/* Writes c to path; says where, or why not. */
static void store(const char *path, const ms_cluster *c, int cores, FILE *log) {
    char dir[600], line[256];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    ms_error e = {0};
    char *text = ms_cluster_to_json(c);
    bool ok =
        mkdirs(dir, &e) == MS_OK && ms_write_file_durable(path, write_text, text, &e) == MS_OK;
    free(text);
    ms_calib_provenance(c, ms_calib_default_max_busy(cores), time(NULL), line, sizeof line);
    if (!log) return;
    if (ok)
        fprintf(log, "cpu-local: calibration cached in %s, %s\n", path, line);
    else
        fprintf(log, "cpu-local: calibration %s, not cached (%s)\n", line, e.msg);
}

/* This process's own measurement, kept when it was not cached (a busy machine): every later
 * resolve in the process uses it, so a job that prices on cpu-local (the advisor, then a switch
 * to searched placements) measures once, not once per caller. Guarded: callers are the live
 * thread and rank 0. */
static pthread_mutex_t run_calib_mu = PTHREAD_MUTEX_INITIALIZER;
static ms_cluster *run_calib;

static bool from_this_run(const char *key, FILE *log, ms_cluster *out) {
    pthread_mutex_lock(&run_calib_mu);
    bool ok = run_calib && !strcmp(run_calib->calibration_key, key);
    if (ok) *out = *run_calib;
    pthread_mutex_unlock(&run_calib_mu);
    if (ok && log)
        fprintf(log, "cpu-local: this run's calibration, measured earlier, not cached\n");
    return ok;
}

static void keep_for_this_run(const ms_cluster *c) {
    pthread_mutex_lock(&run_calib_mu);
    if (!run_calib) run_calib = xmalloc(sizeof *run_calib);
    *run_calib = *c;
    pthread_mutex_unlock(&run_calib_mu);
}

static void forget_this_run(void) {
    pthread_mutex_lock(&run_calib_mu);
    free(run_calib);
    run_calib = NULL;
    pthread_mutex_unlock(&run_calib_mu);
}

ms_status ms_calib_resolve(bool recalibrate, void *logp, ms_cluster *out, ms_error *err) {
    FILE *log = logp;
    char path[600], key[MS_CALIB_KEY_MAX], line[256];
    MS_CHECK(ms_cluster_cache_path(path, sizeof path, err));
    ms_calib_key(key, sizeof key);
    int cores = online_cores();
    if (!recalibrate && from_this_run(key, log, out)) return MS_OK;
    if (!recalibrate && from_cache(path, key, cores, log, out)) return MS_OK;
    ms_calib_quiet q = ms_calib_quiet_limits(cores);
    double before, after, waited;
    bool quiet = wait_quiet(&q, cores, log, &before, &waited);
    if (!quiet && log)
        fprintf(log,
                "cpu-local: the machine stayed busy (%.2f of %d cores, after waiting %.0f s): "
                "measuring for this run only, not caching; rerun with --recalibrate when the "
                "machine is quiet\n",
                before, cores, waited);
    MS_CHECK(ms_cluster_calibrate_cpu(8, log, out, err));
    snprintf(out->calibration, sizeof out->calibration, "%s", MS_CALIBRATION_VERSION);
    snprintf(out->calibration_key, sizeof out->calibration_key, "%s", key);
    if (!ms_cpu_busy_sample(MS_CALIB_SAMPLE_S, &after)) after = -1;
    out->busy_before = before;
    out->busy_after = after;
    out->busy_limit = q.max_busy;
    if (quiet && after > q.max_busy) {
        quiet = false;
        if (log)
            fprintf(log,
                    "cpu-local: the machine got busy while measuring (%.2f of %d cores right "
                    "after): not caching; rerun with --recalibrate when the machine is quiet\n",
                    after, cores);
    }
    if (quiet) {
        forget_this_run(); /* the cache has a newer one */
        store(path, out, cores, log);
        return MS_OK;
    }
    keep_for_this_run(out);
    if (log) {
        ms_calib_provenance(out, ms_calib_default_max_busy(cores), time(NULL), line, sizeof line);
        fprintf(log, "cpu-local: this run's calibration, not cached, %s\n", line);
    }
    return MS_OK;
}

/* fileio.c - whole-file reads with a size cap, and the temp-fsync-rename-fsync write. */
#include "engine/io/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/core/xalloc.h"

/* What a file that is not a regular one is, for messages. */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a folder";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

ms_status ms_open_regular(const char *path, int *fd, uint64_t *size, ms_error *err) {
    *fd = -1;
    *size = 0;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return ms_fail(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return ms_fail(err, MS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return ms_fail(err, MS_ERR_IO, "%s: is %s, not a regular file", path,
                       file_kind(sb.st_mode));
    }
    /* reads block as usual from here on */
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0) fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f;
    *size = (uint64_t)sb.st_size;
    return MS_OK;
}

ms_status ms_read_exact(int fd, void *buf, size_t n, const char *path, ms_error *err) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return ms_fail(err, MS_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        /* A short read without an error means the file shrank while we read it. */
        if (k == 0)
            return ms_fail(err, MS_ERR_IO,
                           "%s: read %zu of %zu bytes: the file changed while "
                           "reading",
                           path, got, n);
        got += (size_t)k;
    }
    return MS_OK;
}

ms_status ms_read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len,
                       ms_error *err) {
    *out = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    MS_CHECK(ms_open_regular(path, &fd, &size, err));
    if (size > (uint64_t)max_bytes) {
        close(fd);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: file is %llu bytes, more than the %zu-byte limit for this kind of "
                       "file; is it the right file?",
                       path, (unsigned long long)size, max_bytes);
    }
    size_t n = (size_t)size;
    uint8_t *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ms_fail(err, MS_ERR_NOMEM, "%s: cannot allocate %zu bytes to read it", path, n + 1);
    }
    ms_status st = ms_read_exact(fd, buf, n, path, err);
    close(fd);
    if (st != MS_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return MS_OK;
}

/* Fault injection state (testing only, see the header). Ranks on the threads backend may
 * write files concurrently, so the unarmed path reads only the atomic flag; the byte count
 * is touched only while a test has a fault armed. */
static atomic_int g_fault = MS_IO_FAULT_NONE;
static size_t g_fault_after = 0;
static size_t g_written = 0;

void ms_io_inject_fault(ms_io_fault fault, size_t after_bytes) {
    g_fault_after = after_bytes;
    g_written = 0;
    atomic_store(&g_fault, (int)fault);
}

static int take_fault(ms_io_fault which) {
    int expect = (int)which;
    return atomic_compare_exchange_strong(&g_fault, &expect, MS_IO_FAULT_NONE);
}

ms_status ms_durable_fwrite(FILE *f, const void *p, size_t n, const char *path, ms_error *err) {
    if (n == 0) return MS_OK;
    if (atomic_load_explicit(&g_fault, memory_order_relaxed) == MS_IO_FAULT_WRITE) {
        if (g_written + n > g_fault_after && take_fault(MS_IO_FAULT_WRITE)) {
            /* Write what fits, then fail the way a full disk does. */
            size_t part = g_fault_after > g_written ? g_fault_after - g_written : 0;
            if (part) fwrite(p, 1, part, f);
            return ms_fail(err, MS_ERR_IO, "%s: write failed: %s", path, strerror(ENOSPC));
        }
        g_written += n;
    }
    if (fwrite(p, 1, n, f) != n)
        return ms_fail(err, MS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return MS_OK;
}

/* --- temporary files ----------------------------------------------------------------------
 * A durable write streams into path + ".tmp." + 6 characters, tens of MB for a checkpoint.
 * When SIGINT or SIGTERM would end the process mid-write, the handler below unlinks every
 * temporary file in flight (their names sit in a fixed table that it reads without locks or
 * allocation), restores the default action and raises the signal again, so that the process
 * still dies of it. Where the program has a handler of its own (the TUI, a server's stop
 * flag), the signal goes to that handler instead and the write carries on: the program
 * decides whether to stop, and an unfinished write removes its own file. What is left anyway
 * (SIGKILL, a crash, a power cut) is swept by the next write of the same path: a writer holds
 * an flock on its temporary file until it is renamed or removed, which tells a stale file
 * from one that another thread or process is still writing. */

#define TMP_SLOTS 16
enum { SLOT_FREE, SLOT_CLAIMED, SLOT_LIVE };
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the signal handler reads the slot states");
static atomic_int g_slot_state[TMP_SLOTS];
static char g_slot_path[TMP_SLOTS][PATH_MAX];

static const int g_sigs[2] = {SIGINT, SIGTERM};
static struct sigaction g_prev[2]; /* the actions ours replaced; read by the handler */
static pthread_mutex_t g_sig_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_writes; /* durable writes in flight; under g_sig_mu */

/* Async-signal-safe: atomics, unlink, sigaction and raise only. */
static void on_signal(int sig, siginfo_t *info, void *uctx) {
    const struct sigaction *prev = &g_prev[sig == SIGINT ? 0 : 1];
    if (prev->sa_flags & SA_SIGINFO) {
        prev->sa_sigaction(sig, info, uctx);
        return;
    }
    if (prev->sa_handler == SIG_IGN) return;
    if (prev->sa_handler != SIG_DFL) {
        prev->sa_handler(sig);
        return;
    }
    for (int i = 0; i < TMP_SLOTS; i++)
        if (atomic_load(&g_slot_state[i]) == SLOT_LIVE) unlink(g_slot_path[i]);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* delivered with the default action once this handler returns */
}

static bool ours(const struct sigaction *sa) {
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_signal;
}

/* The first write in flight puts the handler in front of whatever was there; the last one
 * puts that back, unless someone has installed another handler since (theirs stays). */
static void signals_enter(void) {
    pthread_mutex_lock(&g_sig_mu);
    if (g_writes++ == 0) {
        struct sigaction sa = {.sa_sigaction = on_signal};
        sigemptyset(&sa.sa_mask);
        for (int k = 0; k < 2; k++) sigaddset(&sa.sa_mask, g_sigs[k]);
        for (int k = 0; k < 2; k++) {
            struct sigaction cur;
            if (sigaction(g_sigs[k], NULL, &cur) != 0 || ours(&cur)) continue;
            g_prev[k] = cur;
            /* Interrupted system calls restart, or not, as they did under the old action. */
            sa.sa_flags = SA_SIGINFO | (cur.sa_flags & SA_RESTART);
            sigaction(g_sigs[k], &sa, NULL);
        }
    }
    pthread_mutex_unlock(&g_sig_mu);
}

static void signals_leave(void) {
    pthread_mutex_lock(&g_sig_mu);
    if (--g_writes == 0) {
        for (int k = 0; k < 2; k++) {
            struct sigaction cur;
            if (sigaction(g_sigs[k], NULL, &cur) == 0 && ours(&cur))
                sigaction(g_sigs[k], &g_prev[k], NULL);
        }
    }
    pthread_mutex_unlock(&g_sig_mu);
}

/* A slot naming tmp for the handler, or -1 when the table is full or the name too long (the
 * file is then left to the sweep if a signal comes). */
static int slot_claim(const char *tmp) {
    size_t n = strlen(tmp);
    if (n >= PATH_MAX) return -1;
    for (int i = 0; i < TMP_SLOTS; i++) {
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&g_slot_state[i], &expect, SLOT_CLAIMED)) continue;
        memcpy(g_slot_path[i], tmp, n + 1);
        atomic_store(&g_slot_state[i], SLOT_LIVE);
        return i;
    }
    return -1;
}

static void slot_release(int slot) {
    if (slot >= 0) atomic_store(&g_slot_state[slot], SLOT_FREE);
}

static const char g_alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
#define TMP_TAG    ".tmp."
#define TMP_RANDOM 6

/* Creates and locks tmp, whose last TMP_RANDOM characters it chooses. Mode 0666 lets the
 * umask decide, as for any file the user writes (mkstemp would make it 0600). Returns the
 * descriptor, or -1 with errno set. */
static int create_temp(char *tmp) {
    static atomic_uint_fast64_t counter;
    char *x = tmp + strlen(tmp) - TMP_RANDOM;
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        /* splitmix64 of time, pid and a counter: distinct names, not secrets (O_EXCL makes
         * the creation safe whatever the name). */
        uint64_t r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                     ((uint64_t)getpid() << 40) ^ atomic_fetch_add(&counter, 1);
        r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
        r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
        r ^= r >> 31;
        for (int i = 0; i < TMP_RANDOM; i++, r /= 62) x[i] = g_alnum[r % 62];
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            if (errno == EEXIST) continue;
            return -1;
        }
        /* A sweep may have taken the new file for a stale one between open and lock. */
        struct stat sb;
        if (flock(fd, LOCK_EX) == 0 && fstat(fd, &sb) == 0 && sb.st_nlink == 0) {
            close(fd);
            continue;
        }
        return fd;
    }
    errno = EEXIST;
    return -1;
}

/* True for base + ".tmp." + TMP_RANDOM characters of g_alnum. */
static bool temp_of(const char *name, const char *base, size_t blen) {
    if (strncmp(name, base, blen) || strncmp(name + blen, TMP_TAG, strlen(TMP_TAG))) return false;
    const char *x = name + blen + strlen(TMP_TAG);
    return strlen(x) == TMP_RANDOM && strspn(x, g_alnum) == TMP_RANDOM;
}

/* Removes the temporary files of base in dir that no writer holds locked. Best effort: what
 * cannot be opened, checked or locked is left alone. */
static void sweep_stale(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (!d) return;
    size_t blen = strlen(base);
    for (struct dirent *e; (e = readdir(d));) {
        if (!temp_of(e->d_name, base, blen)) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat held, now;
        /* Locked, and still under this name (not renamed into place meanwhile). */
        if (fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dirfd(d), e->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
            now.st_ino == held.st_ino && now.st_dev == held.st_dev)
            unlinkat(dirfd(d), e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* The folder holding `path` ("." for a bare name), for the directory fsync. */
static char *parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return xstrdup(".");
    if (slash == path) return xstrdup("/");
    size_t n = (size_t)(slash - path);
    char *d = xmalloc(n + 1);
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

ms_status ms_write_file_durable(const char *path, ms_durable_writer writer, void *arg,
                                ms_error *err) {
    size_t plen = strlen(path);
    if (plen == 0 || path[plen - 1] == '/')
        return ms_fail(err, MS_ERR_INVALID, "'%s' names a folder; give a file name to write", path);
    /* The temporary file must be in the same folder: rename is atomic only within one
     * file system, and the folder fsync below must cover both names. */
    static const char suffix[] = TMP_TAG "XXXXXX";
    char *tmp = xmalloc(plen + sizeof suffix);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, suffix, sizeof suffix);
    char *dir = parent_dir(path);
    const char *slash = strrchr(path, '/');
    sweep_stale(dir, slash ? slash + 1 : path);
    ms_status st = MS_OK;
    FILE *f = NULL;
    signals_enter();
    /* fd holds the lock until the file is renamed or removed; the stream writes a dup. */
    int fd = create_temp(tmp), slot = fd >= 0 ? slot_claim(tmp) : -1;
    if (fd < 0) {
        st = ms_fail(err, MS_ERR_IO, "%s: cannot create a temporary file in folder %s: %s", path,
                     dir, strerror(errno));
        goto out_nofile;
    }
    int wfd = dup(fd);
    f = wfd >= 0 ? fdopen(wfd, "wb") : NULL;
    if (!f) {
        st = ms_fail(err, MS_ERR_IO, "%s: fdopen: %s", path, strerror(errno));
        if (wfd >= 0) close(wfd);
        goto out_unlink;
    }
    st = writer(f, arg, err);
    if (st != MS_OK) {
        if (!strstr(err ? err->msg : "", path)) ms_fail_wrap(err, st, "%s", path);
        goto out_close;
    }
    if (fflush(f) != 0) {
        st = ms_fail(err, MS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        goto out_close;
    }
    /* A failed fsync means the data may never reach the disk: the checkpoint is lost. */
    int rc = take_fault(MS_IO_FAULT_FSYNC) ? (errno = EIO, -1) : fsync(fileno(f));
    if (rc != 0) {
        st = ms_fail(err, MS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
        goto out_close;
    }
    int cerr = fclose(f);
    f = NULL;
    if (cerr != 0) {
        st = ms_fail(err, MS_ERR_IO, "%s: close failed: %s", path, strerror(errno));
        goto out_unlink;
    }
    rc = take_fault(MS_IO_FAULT_RENAME) ? (errno = EXDEV, -1) : rename(tmp, path);
    if (rc != 0) {
        st = ms_fail(err, MS_ERR_IO, "%s: cannot rename the temporary file into place: %s", path,
                     strerror(errno));
        goto out_unlink;
    }
    /* The rename itself is durable only once the folder entry is on disk. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd < 0 || fsync(dfd) != 0) {
        st = ms_fail(err, MS_ERR_IO, "%s: written, but fsync of folder %s failed: %s", path, dir,
                     strerror(errno));
    }
    if (dfd >= 0) close(dfd);
    goto out_nofile;

out_close:
    if (f) fclose(f);
out_unlink:
    unlink(tmp);
out_nofile:
    if (fd >= 0) close(fd);
    slot_release(slot);
    signals_leave();
    free(tmp);
    free(dir);
    return st;
}

/* --- folder owners --------------------------------------------------------------------------- */

/* What the holder of a folder's lock wrote into it: "PID HOST", or why it is unknown. */
static void lock_holder(int fd, char *out, size_t len) {
    char text[128] = "";
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    long pid = 0;
    char host[72] = "";
    if (sscanf(text, "%ld %71s", &pid, host) == 2 && pid > 0)
        snprintf(out, len, "pid %ld on %s", pid, host);
    else
        snprintf(out, len, "a process that has not written its pid yet");
}

ms_status ms_dir_lock(const char *dir, int *fd, ms_error *err) {
    *fd = -1;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ms_fail(err, MS_ERR_IO, "cannot create the folder %s: %s", dir, strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (f < 0) return ms_fail(err, MS_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    int rc;
    while ((rc = flock(f, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
        int e = errno;
        char holder[160];
        if (e == EWOULDBLOCK) lock_holder(f, holder, sizeof holder);
        close(f);
        if (e == EWOULDBLOCK)
            return ms_fail(err, MS_ERR_INVALID,
                           "the folder %s is in use by another job (%s): wait for that job to "
                           "end, or give this one another folder",
                           dir, holder);
        return ms_fail(err, MS_ERR_IO, "cannot lock %s: %s", path, strerror(e));
    }
    char host[64] = "?", line[128];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    int n = snprintf(line, sizeof line, "%ld %s\n", (long)getpid(), host);
    if (ftruncate(f, 0) != 0 || pwrite(f, line, (size_t)n, 0) != n) {
        int e = errno;
        close(f);
        return ms_fail(err, MS_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    *fd = f;
    return MS_OK;
}

void ms_dir_unlock(int fd) {
    if (fd >= 0) close(fd);
}

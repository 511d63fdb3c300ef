/* fileio.c - whole-file reads with a size cap, and the temp-fsync-rename-fsync write. */
#include "engine/io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/core/xalloc.h"

ms_status ms_read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len,
                       ms_error *err) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ms_fail(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        int e = errno;
        fclose(f);
        return ms_fail(err, MS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        fclose(f);
        return ms_fail(err, MS_ERR_IO, "%s: is not a regular file (a folder or a device?)", path);
    }
    if ((uint64_t)sb.st_size > (uint64_t)max_bytes) {
        fclose(f);
        return ms_fail(err, MS_ERR_INVALID,
                       "%s: file is %lld bytes, more than the %zu-byte limit for this kind of "
                       "file; is it the right file?",
                       path, (long long)sb.st_size, max_bytes);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return ms_fail(err, MS_ERR_NOMEM, "%s: cannot allocate %zu bytes to read it", path, n + 1);
    }
    size_t got = n ? fread(buf, 1, n, f) : 0;
    int rerr = ferror(f), e = errno;
    fclose(f);
    if (got != n || rerr) {
        free(buf);
        /* A short read without an error means the file shrank while we read it. */
        return ms_fail(err, MS_ERR_IO, "%s: read %zu of %zu bytes: %s", path, got, n,
                       rerr ? strerror(e) : "the file changed while reading");
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
    static const char suffix[] = ".tmp.XXXXXX";
    char *tmp = xmalloc(plen + sizeof suffix);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, suffix, sizeof suffix);
    char *dir = parent_dir(path);
    ms_status st = MS_OK;
    FILE *f = NULL;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = ms_fail(err, MS_ERR_IO, "%s: cannot create a temporary file in folder %s: %s", path,
                     dir, strerror(errno));
        goto out_nofile;
    }
    /* mkstemp makes the file 0600; a checkpoint should be readable like any written file. */
    (void)fchmod(fd, 0644);
    f = fdopen(fd, "wb");
    if (!f) {
        st = ms_fail(err, MS_ERR_IO, "%s: fdopen: %s", path, strerror(errno));
        close(fd);
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
    free(tmp);
    free(dir);
    return st;
}

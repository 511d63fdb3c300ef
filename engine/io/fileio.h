/* fileio.h - whole-file reads and durable whole-file writes with errors as values.
 *
 * Config, data and checkpoint code all need "read this file, with a size cap, and say
 * clearly why not" and "replace this file atomically and durably"; they share these.
 */
#ifndef MS_FILEIO_H
#define MS_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/core/status.h"

/* Opens `path` for reading if it is a regular file. The open does not wait (O_NONBLOCK), so
 * a FIFO or a device where a data file belongs cannot hang the reader; fstat then refuses
 * anything but a regular file. Fails with MS_ERR_IO (missing, unreadable, or not a regular
 * file: the message names what it is, "a FIFO", "a character device", ...). On success the
 * caller owns *fd (blocking again; close it) and *size is the file's size. */
ms_status ms_open_regular(const char *path, int *fd, uint64_t *size, ms_error *err);

/* Reads exactly n bytes at the current offset of fd into buf; a short read (the file
 * shrank) or a read error fails with MS_ERR_IO naming `path`. */
ms_status ms_read_exact(int fd, void *buf, size_t n, const char *path, ms_error *err);

/* Reads all of `path` into a new buffer with one extra '\0' byte after the data (so text
 * can be parsed in place). Fails with MS_ERR_IO (missing, unreadable, a directory, a FIFO or
 * a device: only regular files are read) or MS_ERR_INVALID (larger than max_bytes, the
 * message names the size and the cap), before reading anything.
 * On success the caller owns *out and frees it with free(); on failure *out is NULL. */
ms_status ms_read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len,
                       ms_error *err);

/* Durable replacement of `path`: the writer callback streams the content into a temporary
 * file in the same folder, which is then flushed, fsync'ed, renamed over `path`, and the
 * folder is fsync'ed. On any failure the temporary file is removed, an existing `path` is
 * left untouched, and MS_ERR_IO names the path and the errno text (or the writer's own
 * error is kept, with the path prepended). The writer returns MS_OK or fails through err;
 * it must write with ms_durable_fwrite so that injected faults (below) apply.
 * The file is created with mode 0666 less the umask, like any new file. A SIGINT or SIGTERM
 * that ends the process during the write removes the temporary file first (a handler of the
 * program's own gets the signal instead, and the write goes on); temporary files of `path`
 * that an earlier process left behind (killed, crashed) are removed at the next write. */
typedef ms_status (*ms_durable_writer)(FILE *f, void *arg, ms_error *err);
ms_status ms_write_file_durable(const char *path, ms_durable_writer writer, void *arg,
                                ms_error *err);

/* fwrite that fails with MS_ERR_IO (naming `path` and errno) on a short write. */
ms_status ms_durable_fwrite(FILE *f, const void *p, size_t n, const char *path, ms_error *err);

/* The owner of a folder that one job at a time may write (a checkpoint folder): an exclusive
 * flock on DIR/.lock (DIR is created if missing), held until ms_dir_unlock or the process's
 * end, however it ends (the kernel drops the lock with the last descriptor, so a killed job
 * never leaves its folder locked). The holder writes "PID HOST" into the file; a refused
 * caller gets MS_ERR_INVALID naming the folder and that holder. *fd receives the descriptor
 * that holds the lock (close-on-exec); -1 on failure. */
ms_status ms_dir_lock(const char *dir, int *fd, ms_error *err);
/* Releases a lock of ms_dir_lock (fd < 0: nothing). */
void ms_dir_unlock(int fd);

/* Testing only: makes the next durable write fail at a given stage, once, as if the disk
 * did. Tests arm it right before the write they exercise, with no other writes running;
 * while unarmed it costs one atomic load per write and is safe with concurrent writers. */
typedef enum ms_io_fault {
    MS_IO_FAULT_NONE = 0,
    MS_IO_FAULT_WRITE,  /* the write crossing `after_bytes` bytes (since arming) gets ENOSPC */
    MS_IO_FAULT_FSYNC,  /* fsync of the temporary file returns EIO */
    MS_IO_FAULT_RENAME, /* rename returns EXDEV */
} ms_io_fault;
void ms_io_inject_fault(ms_io_fault fault, size_t after_bytes);

#endif

/* xalloc.h - aborting allocators for small bookkeeping structures.
 *
 * Policy (in the name): xmalloc/xcalloc/xrealloc/xstrdup/xaligned_alloc never return NULL;
 * when memory is exhausted they call ms_panic (panic.h: hooks, message, abort). They are for
 * metadata that is tiny next to tensor storage. Tensors, workspaces and other large buffers
 * go through the device interface (device.h), which returns MS_ERR_NOMEM.
 */
#ifndef MS_XALLOC_H
#define MS_XALLOC_H

#include <stddef.h>

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* `align` a power of two and a multiple of sizeof(void *); n is rounded up to it. */
void *xaligned_alloc(size_t align, size_t n);

/* A growable byte buffer, always NUL-terminated after `len` bytes (text built piece by piece:
 * JSON headers, HTTP bodies). Zero-initialise; free `p` when done. */
typedef struct ms_strbuf {
    char *p;
    size_t len, cap;
} ms_strbuf;
void ms_strbuf_put(ms_strbuf *b, const void *data, size_t n);
void ms_strbuf_printf(ms_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

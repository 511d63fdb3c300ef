/* panic.h - the one way the process dies on purpose.
 *
 * Library code returns errors (status.h). A few failures leave nothing sensible to return:
 * a bookkeeping allocation that failed (xalloc.h), a broken invariant with no caller to
 * tell. Those call ms_panic, which runs the registered hooks (the terminal view restores the
 * terminal), writes "meshscope: <message>" to stderr and aborts, so a core dump or a
 * debugger still sees the failing stack.
 *
 * Hooks run on the panicking thread, each at most once, with no lock taken:
 * ms_panic may be called from a failing allocation anywhere, with any lock held. A hook
 * must therefore only do what is async-signal-safe (write, tcsetattr) and must not
 * allocate. A second panic while the first runs its hooks (another thread, or a hook that
 * panics) skips the hooks and aborts at once.
 */
#ifndef MS_PANIC_H
#define MS_PANIC_H

#include <stdbool.h>

#define MS_PANIC_MAX_HOOKS 8

typedef void (*ms_panic_hook)(void *user);

/* Registers fn(user); false when all MS_PANIC_MAX_HOOKS slots are taken. The same pair may
 * be registered once; registering it again is a no-op that returns true. */
bool ms_panic_hook_add(ms_panic_hook fn, void *user);
/* Forgets fn(user) (no-op if it is not registered). */
void ms_panic_hook_remove(ms_panic_hook fn, void *user);

/* Runs the hooks, prints the message and aborts. Never returns. */
_Noreturn void ms_panic(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

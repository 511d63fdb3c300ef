/* panic.c - ms_panic and its hook registry (see panic.h).
 *
 * The registry is a fixed array of slots, each claimed with a compare-and-swap on its state
 * (free -> busy -> ready), so registering never allocates or locks and ms_panic can read it
 * from any thread at any moment: it runs only slots that are ready. */
#include "engine/core/panic.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SLOT_FREE, SLOT_BUSY, SLOT_READY };

typedef struct slot {
    _Atomic int state;
    _Atomic(ms_panic_hook) fn;
    _Atomic(void *) user;
} slot;

static slot g_hooks[MS_PANIC_MAX_HOOKS];
static atomic_flag g_panicking = ATOMIC_FLAG_INIT;

static bool slot_is(slot *s, ms_panic_hook fn, void *user) {
    return atomic_load(&s->state) == SLOT_READY && atomic_load(&s->fn) == fn &&
           atomic_load(&s->user) == user;
}

bool ms_panic_hook_add(ms_panic_hook fn, void *user) {
    for (int i = 0; i < MS_PANIC_MAX_HOOKS; i++)
        if (slot_is(&g_hooks[i], fn, user)) return true;
    for (int i = 0; i < MS_PANIC_MAX_HOOKS; i++) {
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&g_hooks[i].state, &expect, SLOT_BUSY)) continue;
        atomic_store(&g_hooks[i].fn, fn);
        atomic_store(&g_hooks[i].user, user);
        atomic_store(&g_hooks[i].state, SLOT_READY);
        return true;
    }
    return false;
}

void ms_panic_hook_remove(ms_panic_hook fn, void *user) {
    for (int i = 0; i < MS_PANIC_MAX_HOOKS; i++) {
        int expect = SLOT_READY;
        if (!slot_is(&g_hooks[i], fn, user)) continue;
        if (atomic_compare_exchange_strong(&g_hooks[i].state, &expect, SLOT_BUSY)) {
            atomic_store(&g_hooks[i].fn, NULL);
            atomic_store(&g_hooks[i].user, NULL);
            atomic_store(&g_hooks[i].state, SLOT_FREE);
        }
    }
}

static void write_all(const char *s, size_t n) {
    while (n) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w, n -= (size_t)w;
    }
}

_Noreturn void ms_panic(const char *fmt, ...) {
    /* Formatted first, on the stack: the hooks may change errno or the terminal. */
    char msg[1024];
    int k = snprintf(msg, sizeof msg, "meshscope: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + k, sizeof msg - (size_t)k - 1, fmt, ap);
    va_end(ap);
    size_t n = strlen(msg);
    msg[n++] = '\n';
    if (!atomic_flag_test_and_set(&g_panicking))
        for (int i = MS_PANIC_MAX_HOOKS - 1; i >= 0; i--) {
            int expect = SLOT_READY;
            /* Claimed for good: a hook runs at most once. */
            if (atomic_compare_exchange_strong(&g_hooks[i].state, &expect, SLOT_BUSY)) {
                ms_panic_hook fn = atomic_load(&g_hooks[i].fn);
                if (fn) fn(atomic_load(&g_hooks[i].user));
            }
        }
    write_all(msg, n);
    abort();
}

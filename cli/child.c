/* child.c - a child process that does not outlive its parent (see child.h). */
#include "cli/child.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_SIGS 3
static const int g_sigs[N_SIGS] = {SIGTERM, SIGINT, SIGHUP};
static struct sigaction g_prev[N_SIGS]; /* the actions ours replaced; read by the handler */
static bool g_caught[N_SIGS];           /* ours is installed (not ignored at start) */

/* What the handler reads and writes. */
static volatile sig_atomic_t g_target;    /* the child's pid, its group as -pid; 0: none */
static volatile sig_atomic_t g_last;      /* the last signal forwarded */
static volatile sig_atomic_t g_forwarded; /* how many were */

/* Async-signal-safe: kill, sigaction and raise only. */
static void on_signal(int sig) {
    int saved = errno;
    pid_t to = (pid_t)g_target;
    if (to) {
        g_last = sig;
        g_forwarded = g_forwarded + 1;
        kill(to, sig);
    } else {
        /* No child: the signal does what it did before ours was installed. */
        for (int i = 0; i < N_SIGS; i++)
            if (g_sigs[i] == sig) sigaction(sig, &g_prev[i], NULL);
        raise(sig);
    }
    errno = saved;
}

static void install(void) {
    static bool done;
    if (done) return;
    done = true;
    for (int i = 0; i < N_SIGS; i++) {
        sigaction(g_sigs[i], NULL, &g_prev[i]);
        /* Started ignoring it (`nohup`, a shell's background job): it stays ignored. */
        if (g_prev[i].sa_handler == SIG_IGN) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0; /* no SA_RESTART: a wait wakes up to start the grace period */
        sigaction(g_sigs[i], &sa, NULL);
        g_caught[i] = true;
    }
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL); /* a signal cuts it short: fine, the caller loops */
}

bool ms_child_is_launcher(const char *arg0) {
    const char *base = strrchr(arg0, '/');
    base = base ? base + 1 : arg0;
    static const char *const names[] = {"mpirun", "mpiexec", "orterun", "prterun"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strncmp(base, names[i], strlen(names[i]))) return true;
    return false;
}

int ms_child_start(char *const argv[], bool own_group, int stdout_fd, ms_child *c) {
    install();
    /* Blocked from before the fork until the handler knows the child, so that no signal
     * falls in between: one that arrives meanwhile is forwarded once they are unblocked. */
    sigset_t block, old;
    sigemptyset(&block);
    for (int i = 0; i < N_SIGS; i++) sigaddset(&block, g_sigs[i]);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t pid = fork();
    if (pid == 0) {
        if (own_group) setpgid(0, 0);
        if (stdout_fd >= 0 && stdout_fd != STDOUT_FILENO) dup2(stdout_fd, STDOUT_FILENO);
        for (int i = 0; i < N_SIGS; i++)
            if (g_caught[i]) sigaction(g_sigs[i], &g_prev[i], NULL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(argv[0], argv);
        /* write(2) alone: stdio's locks may be held by a thread that did not fork */
        const char *part[] = {"meshscope: cannot run ", argv[0], ": ", strerror(errno), "\n"};
        for (size_t i = 0; i < sizeof part / sizeof *part; i++)
            if (write(STDERR_FILENO, part[i], strlen(part[i])) < 0) break;
        _exit(127);
    }
    int e = errno;
    if (pid > 0) {
        if (own_group) setpgid(pid, pid); /* as the child does: whichever runs first */
        *c = (ms_child){.pid = pid, .group = own_group, .forwarded = (int)g_forwarded};
        g_target = own_group ? -pid : pid;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return pid > 0 ? 0 : -1;
}

/* After the child ended: kills what is left of its process group and waits (bounded) until
 * the group is gone, so that a restart never meets the old job's processes. */
static void sweep_group(pid_t pgid) {
    if (kill(-pgid, SIGKILL) != 0) return; /* nothing left */
    for (int64_t until = now_ms() + 5000; now_ms() < until;) {
        while (waitpid(-pgid, NULL, WNOHANG) > 0) {
        }
        if (kill(-pgid, 0) != 0) return;
        nap_ms(10);
    }
}

static int wait_until(ms_child *c, int64_t deadline, int grace_s) {
    int status = 0;
    bool killed = false;
    for (;;) {
        pid_t r = waitpid(c->pid, &status, WNOHANG);
        if (r == c->pid) break;
        if (r < 0 && errno != EINTR) {
            status = 127 << 8; /* reaped elsewhere: nothing to say of it */
            break;
        }
        if (!deadline && (int)g_forwarded != c->forwarded)
            deadline = now_ms() + (int64_t)grace_s * 1000;
        if (deadline && !killed && now_ms() >= deadline) {
            fprintf(stderr,
                    "meshscope: the child %d did not end within %d s of the signal; killing it\n",
                    (int)c->pid, grace_s);
            kill(c->group ? -c->pid : c->pid, SIGKILL);
            killed = true;
        }
        nap_ms(50);
    }
    g_target = 0;
    if (c->group) sweep_group(c->pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int ms_child_wait(ms_child *c, int grace_s) {
    return wait_until(c, 0, grace_s);
}

int ms_child_stop(ms_child *c, int sig, int grace_s) {
    kill(c->group ? -c->pid : c->pid, sig);
    return wait_until(c, now_ms() + (int64_t)grace_s * 1000, grace_s);
}

int ms_child_forwarded(void) {
    return (int)g_last;
}

/* child.h - a child process that does not outlive its parent: `meshscope run`'s job,
 * `bench comm`'s mpirun.
 *
 * One child at a time per process. While it runs, SIGTERM, SIGINT and SIGHUP sent to this
 * process are forwarded to it -- to its whole process group when it was started in one of its
 * own (an MPI launcher and the ranks it starts) -- and the wait for it is bounded: a child
 * still running grace_s seconds after a forwarded signal is killed (SIGKILL). What is left of
 * its own process group once it has ended is killed too, so that nothing it started runs on as
 * an orphan. With no child running, those signals act as they did before (a signal this
 * process was started ignoring stays ignored, for the child as well).
 */
#ifndef MS_CHILD_H
#define MS_CHILD_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct ms_child {
    pid_t pid;
    bool group;    /* in a process group of its own (its id is pid) */
    int forwarded; /* signals forwarded before this child started (a private count) */
} ms_child;

/* Whether arg0 names an MPI launcher (mpirun, mpiexec, orterun, prterun, by base name): its
 * ranks are its children, so it runs in a process group of its own. */
bool ms_child_is_launcher(const char *arg0);

/* Starts argv (PATH searched) as this process's child: with own_group in a process group of
 * its own; stdout_fd >= 0 becomes its standard output. Returns 0, or -1 with errno set (the
 * caller says what could not start; a program that cannot be run exits 127). */
int ms_child_start(char *const argv[], bool own_group, int stdout_fd, ms_child *c);

/* Waits for the child to end, forwarding signals meanwhile; once one was forwarded, waits at
 * most grace_s more seconds before SIGKILL. Returns its exit code, or 128 + the signal that
 * ended it. */
int ms_child_wait(ms_child *c, int grace_s);

/* Ends the child now: sig (to its group when it has one), then waits as ms_child_wait with
 * grace_s. */
int ms_child_stop(ms_child *c, int sig, int grace_s);

/* The last signal forwarded to a child (0: none): a job told to stop is not restarted. */
int ms_child_forwarded(void);

#endif

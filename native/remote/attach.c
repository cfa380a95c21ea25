/* Stopping one thread of another process to read its registers (ptrace).
 *
 * PTRACE_SEIZE does not stop the thread and sends it no signal (unlike
 * PTRACE_ATTACH's SIGSTOP, which could be seen by the target as a job-control
 * stop); PTRACE_INTERRUPT then stops it, and PTRACE_DETACH lets it go on as
 * if nothing happened.  A signal that arrived meanwhile is reported to us
 * instead of being delivered: it is handed back at detach.  The caller
 * (btcore/remote/process.py) detaches every thread it stopped, on every path.
 */
#include <errno.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <time.h>

#include "capture/arch.h"

/* Wait for tid's stop, at most timeout_ms; 0, or -errno (-ETIMEDOUT,
 * -ESRCH when the thread exited). */
static int wait_stop(int tid, int timeout_ms, int *pending_signal)
{
    struct timespec pause = {0, 100000};   /* 0.1 ms */
    for (int waited = 0;; waited++) {
        int status;
        pid_t r = waitpid(tid, &status, __WALL | WNOHANG);
        if (r < 0)
            return -errno;
        if (r == tid && (WIFEXITED(status) || WIFSIGNALED(status)))
            return -ESRCH;
        if (r == tid && WIFSTOPPED(status)) {
            /* A signal-delivery stop (not our interrupt's PTRACE_EVENT_STOP):
             * the signal goes back to the thread at detach. */
            if ((status >> 16) != PTRACE_EVENT_STOP && WSTOPSIG(status) != SIGTRAP)
                *pending_signal = WSTOPSIG(status);
            return 0;
        }
        if (waited / 10 >= timeout_ms)
            return -ETIMEDOUT;
        nanosleep(&pause, NULL);
    }
}

/* The registers the walk starts from, as regs = {ip, sp, fp, aux} (arch.h). */
static int read_regs(int tid, uintptr_t *regs)
{
    btc_regs r = {0};
    int rc = btc_ptrace_regs(tid, &r);
    regs[0] = r.ip;
    regs[1] = r.sp;
    regs[2] = r.fp;
    regs[3] = r.aux;
    return rc;
}

int btc_ptrace_stop(int tid, int timeout_ms, uintptr_t *regs, int *pending_signal)
{
    *pending_signal = 0;
    if (ptrace(PTRACE_SEIZE, tid, 0, 0) != 0)
        return -errno;
    if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) != 0)
        return -errno;   /* seized: the caller detaches */
    int rc = wait_stop(tid, timeout_ms, pending_signal);
    return rc ? rc : read_regs(tid, regs);
}

/* A thread seized but not yet stopped (it did not stop within the timeout:
 * in uninterruptible sleep) cannot be detached; it stops as soon as it can
 * (the interrupt is pending), so wait for that once more, then detach.  A
 * thread that never stops stays traced until this process exits, when the
 * kernel detaches it. */
#define DETACH_WAIT_MS 1000

int btc_ptrace_detach(int tid, int signal)
{
    if (ptrace(PTRACE_DETACH, tid, 0, (void *)(uintptr_t)signal) == 0)
        return 0;
    int pending = 0, rc = errno == ESRCH ? wait_stop(tid, DETACH_WAIT_MS, &pending) : -errno;
    if (rc)
        return rc;
    return ptrace(PTRACE_DETACH, tid, 0, (void *)(uintptr_t)(signal ? signal : pending)) == 0 ? 0 : -errno;
}

/* register_dump_signal(stuck=True): a dump that does not wait for Python.
 *
 * A Python-level handler runs only when the main thread gets back to the
 * interpreter, never while it is stuck in C.  Here the handler (C, async-
 * signal-safe) only posts a semaphore; a C thread waiting on it samples the
 * registering thread, then every other registered thread (all the
 * interpreter's threads at install time are), each through the capture
 * signal, and writes their stacks, named in C (report.c), without the GIL:
 * whichever thread holds the GIL in C is shown where it is.
 */
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "capture/signal_capture.h"
#include "common/chain_handler.h"
#include "common/own_thread.h"
#include "watch/report.h"

static struct {
    int signum;             /* 0: none installed */
    struct sigaction previous;
    bool chain;
    bool active;            /* fd open, semaphore made (thread and handler may be) */
    int fd, slot;
    pthread_t thread;
    bool thread_alive;
    atomic_bool stopping;
    sem_t wake;
    btc_sigsample sample;   /* the dump thread's */
} dumper;

static char dump_buf[64 * 1024];

static void on_dump_signal(int signum, siginfo_t *si, void *ucontext)
{
    int saved_errno = errno;
    sem_post(&dumper.wake);
    if (dumper.chain)
        btc_call_handler(&dumper.previous, signum, si, ucontext);
    errno = saved_errno;
}

/* One thread's stack, sampled by the capture signal (a bounded wait: a
 * thread that does not answer in a second is said so). */
static void dump_thread(int slot)
{
    btc_text t = {dump_buf, sizeof dump_buf, 0};
    btc_text_addf(&t, "btcore: signal %d: the stack of thread %llu, innermost first:\n", dumper.signum,
                  (unsigned long long)btc_thread_ident_of(slot));
    if (btc_signal_sample_slot(slot, 1000, &dumper.sample) == 0)
        btc_sigsample_text(&dumper.sample, &t);
    else
        btc_text_add(&t, "  (the thread did not answer the capture signal)\n");
    btc_text_write(&t, dumper.fd);
}

/* The registering thread first, then every other registered thread: any
 * of them may hold the GIL in C, so each one is sampled in its own thread. */
static void dump_once(void)
{
    dump_thread(dumper.slot);
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        if (i != dumper.slot && btc_thread_ident_of(i))
            dump_thread(i);
}

static void *dumper_main(void *arg BTC_UNUSED)
{
    for (;;) {
        while (sem_wait(&dumper.wake) != 0 && errno == EINTR)
            ;
        if (atomic_load(&dumper.stopping))
            return NULL;
        dump_once();
    }
}

int btc_dump_signal_install(int signum, int fd, int chain)
{
    if (dumper.active || signum <= 0 || signum == btc_capture_signal())
        return -1;
    int slot = btc_thread_register();
    if (slot < 0 || btc_thread_register_others() < 0 || (dumper.fd = dup(fd)) < 0)
        return -1;
    dumper.active = true;
    dumper.slot = slot;
    dumper.chain = chain != 0;
    atomic_store(&dumper.stopping, false);
    sem_init(&dumper.wake, 0, 0);
    dumper.thread_alive = btc_own_thread_start(&dumper.thread, dumper_main, NULL) == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_dump_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (!dumper.thread_alive || sigaction(signum, &sa, &dumper.previous) != 0) {
        btc_dump_signal_uninstall(0);
        return -1;
    }
    dumper.signum = signum;
    return 0;
}

int btc_dump_signal_uninstall(int signum)
{
    if (!dumper.active || (signum && signum != dumper.signum))
        return 0;
    if (dumper.signum)
        sigaction(dumper.signum, &dumper.previous, NULL);
    if (dumper.thread_alive) {
        PyThreadState *gil = PyGILState_Check() ? PyEval_SaveThread() : NULL;
        atomic_store(&dumper.stopping, true);
        sem_post(&dumper.wake);
        pthread_join(dumper.thread, NULL);
        if (gil)
            PyEval_RestoreThread(gil);
    }
    close(dumper.fd);
    sem_destroy(&dumper.wake);
    int was = dumper.signum != 0;
    dumper.signum = 0;
    dumper.thread_alive = false;
    dumper.active = false;
    return was;
}

/* A forked child has no dump thread: the handler stays (posting to nobody)
 * until unregistered. */
static void child_after_fork(void)
{
    dumper.thread_alive = false;
}

__attribute__((constructor)) static void dump_signal_fork_safe(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* btcore's own C threads start fully before the caller goes on.
 *
 * Why wait for the start: a process that forks right after starting the
 * watchdog (a pre-fork server does) would otherwise fork while the new
 * thread is still inside the C runtime's thread start, holding whatever it
 * holds there.  glibc's malloc is fork-safe, but not every allocator is:
 * gcc 12's AddressSanitizer takes an allocator lock in its thread start
 * and does not take it around fork, and the forked child's next allocation
 * waited on it forever (tests/test_watchdog.py's fork test, in ci/asan.sh).
 * Once the thread runs its loop, it allocates only while naming frames (a
 * library's symbols read for the first time), through glibc's fork-safe
 * malloc; under gcc 12's ASan that rarer window remains.
 */
#include <errno.h>
#include <semaphore.h>
#include <signal.h>

#include "common/own_thread.h"

typedef struct {
    void *(*main)(void *);
    void *arg;
    sem_t running;
} start_request;

static void *trampoline(void *arg)
{
    start_request *req = arg;
    void *(*main)(void *) = req->main, *main_arg = req->arg;
    sem_post(&req->running);   /* req lives on the starter's stack: not used after this */
    return main(main_arg);
}

int btc_own_thread_start(pthread_t *thread, void *(*main)(void *), void *arg)
{
    start_request req = {.main = main, .arg = arg};
    if (sem_init(&req.running, 0, 0) != 0)
        return -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* the new thread inherits this mask */
    int rc = pthread_create(thread, NULL, trampoline, &req);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        while (sem_wait(&req.running) != 0 && errno == EINTR)
            ;
    sem_destroy(&req.running);
    return rc == 0 ? 0 : -1;
}

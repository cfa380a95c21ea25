/* register_dump_signal(): the Python handler runs promptly, even while the
 * main thread waits.
 *
 * Python's C handler only notes the signal; the main thread runs the Python
 * handler the next time it executes bytecode.  A main thread blocked in a
 * wait (time.sleep, gevent's hub in epoll_wait, asyncio's selector) gets
 * there only if the signal interrupted that very wait, which it does not
 * when it ran in another thread, nor when it came in the main thread just
 * after the loop last looked for signals and before it blocked: libev then
 * sleeps until its next event, up to a minute (1 dump in 200 on an idle
 * uWSGI gevent worker).  signal.set_wakeup_fd(), Python's remedy, has one
 * fd, which the event loops own.
 *
 * So btcore's C handler wraps Python's: after calling it, it arms a one-shot
 * POSIX timer aimed at the main thread (SIGEV_THREAD_ID) that sends the same
 * signal, tagged with this slot, FIRST_NS later.  Its arrival interrupts the
 * wait (EINTR: Python's wrappers and libev then look for signals).  A tagged
 * signal does not call Python's handler: it only re-arms the timer, twice as
 * long each time, until the Python handler has started
 * (btc_prompt_signal_seen) or NUDGES times (a main thread stuck in C runs
 * no handler however often it is interrupted).  No lock, no thread: the
 * handler uses only atomics and timer_settime, async-signal-safe.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/chain_handler.h"

#define FIRST_NS 10000000L   /* 10 ms: a main thread running bytecode has run the handler by then */
#define NUDGES 6             /* 10 + 20 + ... + 320 ms, then the main thread is left alone */

typedef struct {
    bool installed;
    struct sigaction python;   /* Python's C handler, called for every signal not ours */
    timer_t timer;
    bool timer_made;
    pid_t target;              /* the main thread (the one that installed) */
    atomic_uint signalled;     /* signals passed to Python's handler */
    atomic_uint seen;          /* of them, those its Python handler has started after */
    atomic_int nudges;         /* tagged signals since the last real one */
} prompt_slot;

static prompt_slot slots[NSIG];

static void arm(prompt_slot *p, long ns)
{
    struct itimerspec at = {.it_value = {ns / 1000000000L, ns % 1000000000L}};
    timer_settime(p->timer, 0, &at, NULL);
}

static void disarm(prompt_slot *p)
{
    struct itimerspec never = {{0, 0}, {0, 0}};
    timer_settime(p->timer, 0, &never, NULL);
}

static bool owed(prompt_slot *p)
{
    return atomic_load(&p->seen) != atomic_load(&p->signalled);
}

static void on_signal(int signum, siginfo_t *si, void *ucontext)
{
    int saved_errno = errno;
    prompt_slot *p = &slots[signum];
    if (si && si->si_code == SI_TIMER && si->si_value.sival_ptr == p) {
        int n = atomic_fetch_add(&p->nudges, 1) + 1;
        if (owed(p) && n < NUDGES)
            arm(p, FIRST_NS << n);
    } else {
        btc_call_handler(&p->python, signum, si, ucontext);
        atomic_fetch_add(&p->signalled, 1);
        atomic_store(&p->nudges, 0);
        if (p->timer_made)
            arm(p, FIRST_NS);
    }
    errno = saved_errno;
}

static bool make_timer(int signum, prompt_slot *p)
{
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = signum;
    ev.sigev_value.sival_ptr = p;
    ev._sigev_un._tid = p->target;
    p->timer_made = timer_create(CLOCK_MONOTONIC, &ev, &p->timer) == 0;
    return p->timer_made;
}

int btc_prompt_signal_install(int signum)
{
    if (signum <= 0 || signum >= NSIG || slots[signum].installed)
        return -1;
    prompt_slot *p = &slots[signum];
    p->target = gettid();
    if (!make_timer(signum, p))
        return -1;
    struct sigaction ours;
    if (sigaction(signum, NULL, &p->python) != 0) {
        timer_delete(p->timer);
        p->timer_made = false;
        return -1;
    }
    ours = p->python;   /* Python's mask and flags (SA_ONSTACK; SA_RESTART only if siginterrupt asked) */
    ours.sa_flags = (p->python.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    ours.sa_sigaction = on_signal;
    atomic_store(&p->seen, atomic_load(&p->signalled));
    p->installed = true;
    if (sigaction(signum, &ours, NULL) != 0) {
        p->installed = false;
        timer_delete(p->timer);
        p->timer_made = false;
        return -1;
    }
    return 0;
}

void btc_prompt_signal_seen(int signum)
{
    if (signum <= 0 || signum >= NSIG || !slots[signum].installed)
        return;
    prompt_slot *p = &slots[signum];
    atomic_store(&p->seen, atomic_load(&p->signalled));
    if (p->timer_made)
        disarm(p);   /* a nudge already queued finds nothing owed */
}

/* Called in the main thread, before Python puts another handler back: the
 * timer is disarmed first, and a tagged signal already queued for this
 * thread is delivered (to on_signal, still installed) as that call returns
 * to user space, so none reaches the next handler (SIG_DFL would end the
 * process).  -1 from another thread (only the main one may change handlers). */
int btc_prompt_signal_uninstall(int signum)
{
    if (signum <= 0 || signum >= NSIG || !slots[signum].installed)
        return 0;
    prompt_slot *p = &slots[signum];
    if (gettid() != p->target)
        return -1;
    if (p->timer_made) {
        disarm(p);
        timer_delete(p->timer);
        p->timer_made = false;
    }
    sigaction(signum, &p->python, NULL);
    p->installed = false;
    return 1;
}

/* Timers are not inherited: the child makes its own, aimed at its only
 * thread (Python's main thread there).  timer_create is a system call for
 * SIGEV_THREAD_ID (glibc allocates only for SIGEV_THREAD). */
static void child_after_fork(void)
{
    for (int signum = 1; signum < NSIG; signum++) {
        prompt_slot *p = &slots[signum];
        if (!p->installed)
            continue;
        p->target = gettid();
        atomic_store(&p->seen, atomic_load(&p->signalled));   /* Python forgets the signals it owed */
        atomic_store(&p->nudges, 0);
        make_timer(signum, p);
    }
}

__attribute__((constructor)) static void prompt_signal_fork_safe(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* The watchdog: a C thread that notices a thread whose greenlets stopped
 * switching and writes its stack while it is still stuck.
 *
 * Switch detection costs a switch nothing: greenlet already counts them.
 * Every switch into a greenlet increments the thread state's context_ver
 * (greenlet's PythonState::operator>>, to invalidate contextvars' caches),
 * a 64-bit counter in the public PyThreadState.  The watchdog thread reads
 * it each tick, without the GIL (one aligned load); a counter that has not
 * moved for the threshold means the same greenlet has run all that time:
 * it samples the thread through the capture signal (signal_capture.c),
 * names the frames in C (report.c) and writes the report with write(2).
 * It never takes the GIL: the stuck thread may hold it (a C loop), and the
 * report must come while it is stuck, not after.
 *
 * Why a counter and not the current greenlet: A -> B -> A between two
 * ticks leaves A current at both, but the counter moved by 2; and a
 * greenlet freed and another allocated at the same address (ABA) cannot
 * fool a comparison that compares no identities.  The counter only moves
 * more often than greenlets switch (contextvars' Context.run enters and
 * exits bump it too): a loop that keeps calling Context.run is not seen as
 * stuck; nothing stuck is missed otherwise, and nothing unstuck is seen.
 */
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "capture/capture.h"
#include "capture/modules.h"
#include "capture/signal_capture.h"
#include "common/errors.h"
#include "common/own_thread.h"
#include "watch/report.h"

/* Set by the watched thread (GIL held), read by the watchdog thread. */
typedef struct {
    _Atomic(const uint64_t *) progress;   /* &tstate->context_ver; NULL once the thread state is cleared */
    _Atomic int reading;                  /* the watchdog is reading *progress (the clearing waits) */
    _Atomic int watched;
    _Atomic uintptr_t thread;             /* the watched thread: a slot reused by another thread is not watched */
    _Atomic uintptr_t idle_code;          /* the code a waiting thread is sampled in (a reference kept for
                                           * good), or 0: see btc_watch_thread */
    _Atomic uintptr_t wait_lo, wait_hi;   /* a C event loop's code, where its wait is called from; empty: any */
    _Atomic uintptr_t interpreter_lo, interpreter_hi;   /* the interpreter's code */
} watched_thread;

/* The watchdog thread's own view of each watched thread. */
typedef struct {
    uint64_t seen;
    double since;      /* when seen was first seen */
    double next;       /* report when stuck this long */
    bool stuck;        /* reported, not recovered yet */
    uint64_t thread;   /* the thread reported stuck (its slot may be empty by the time it recovers) */
    bool shown;        /* a stack of this stuck call was reported: dog.shown[slot] holds it */
    double shown_at;   /* stuck for how long when it was */
} stuck_state;

static watched_thread watched[BTC_WATCHED_THREADS];

static struct {
    pthread_t thread;
    bool running;
    bool stopping;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    double threshold;
    int fd;
    bool repeat;
    _Atomic int reports;
    stuck_state states[BTC_WATCHED_THREADS];
    btc_sigsample sample;   /* the watchdog thread's */
    /* Per slot, the sample last reported of the current stuck call: a later
     * report says only what changed against it.  Apart from states so that
     * resetting a state (every tick of a busy thread) stays small. */
    btc_sigsample shown[BTC_WATCHED_THREADS];
} dog = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the watched side (GIL held) ---- */

#define THREAD_DICT_KEY "btcore.watch.watchdog"

/* The thread state is being cleared (its thread ends, or a forked child
 * drops it): the watchdog must stop reading it before it is freed.  A
 * Dekker pair with read_progress(): progress is cleared first, then the
 * read in flight, a few instructions, is waited out. */
static void forget_thread_state(PyObject *capsule)
{
    watched_thread *w = PyCapsule_GetPointer(capsule, NULL);
    const uint64_t *mine = &((PyThreadState *)PyCapsule_GetContext(capsule))->context_ver;
    if (!w || !atomic_compare_exchange_strong(&w->progress, &mine, NULL))
        return;   /* the slot watches another thread state now */
    while (atomic_load(&w->reading))
        sched_yield();
}

/* Point w at the calling thread's switch counter, and have the thread
 * state's clearing (its dict is cleared before it is freed) undo that. */
static int follow_thread_state(watched_thread *w)
{
    PyThreadState *ts = PyThreadState_Get();
    if (atomic_load(&w->progress) == &ts->context_ver)
        return 0;
    PyObject *dict = PyThreadState_GetDict();
    PyObject *capsule = PyCapsule_New(w, NULL, forget_thread_state);
    int rc = capsule && dict && PyCapsule_SetContext(capsule, ts) == 0 ? PyDict_SetItemString(dict, THREAD_DICT_KEY, capsule) : -1;
    Py_XDECREF(capsule);
    if (rc == 0)
        atomic_store(&w->progress, &ts->context_ver);
    return rc;
}

/* The span of the module holding the interpreter's code (libpython, or the
 * executable it is linked into); empty if not found. */
static void interpreter_code(_Atomic uintptr_t *lo, _Atomic uintptr_t *hi)
{
    btc_modules_acquire();
    const btc_module *m = btc_module_find((uintptr_t)&PyObject_Call);
    atomic_store(lo, m ? m->lo : 0);
    atomic_store(hi, m ? m->hi : 0);
    btc_modules_release();
}

int btc_watch_thread(uintptr_t idle_code, uintptr_t wait_lo, uintptr_t wait_hi)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int slot = btc_thread_register();
    if (slot >= 0) {
        watched_thread *w = &watched[slot];
        if (follow_thread_state(w) < 0) {
            PyErr_Clear();
            slot = btc_fail(BTC_E_UNSUPPORTED, "cannot follow the thread state's switch counter");
        } else {
            interpreter_code(&w->interpreter_lo, &w->interpreter_hi);
            atomic_store(&w->wait_lo, wait_lo);
            atomic_store(&w->wait_hi, wait_hi);
            if (idle_code && atomic_load(&w->idle_code) != idle_code)
                atomic_store(&w->idle_code, (uintptr_t)Py_NewRef((PyObject *)idle_code));   /* kept for good */
            atomic_store(&w->thread, (uintptr_t)pthread_self());
            atomic_store(&w->watched, 1);
        }
    }
    PyGILState_Release(gil);
    return slot;
}

void btc_unwatch_thread(void)
{
    int slot = btc_thread_slot_self();
    if (slot >= 0)
        atomic_store(&watched[slot].watched, 0);
}

uint64_t btc_switch_count(void)
{
    PyThreadState *ts = PyGILState_GetThisThreadState();
    return ts ? ts->context_ver : 0;
}

int64_t btc_thread_switch_count(uint64_t ident)
{
    PyThreadState *ts = btc_thread_state_of(ident);
    return ts ? (int64_t)ts->context_ver : -1;
}

/* The watched thread's switch count; false when it is not watched (any more). */
static bool read_progress(int slot, uint64_t *out)
{
    watched_thread *w = &watched[slot];
    if (!atomic_load(&w->watched) || atomic_load(&w->thread) != btc_thread_ident_of(slot))
        return false;
    atomic_store(&w->reading, 1);
    const uint64_t *p = atomic_load(&w->progress);
    if (p)
        *out = __atomic_load_n(p, __ATOMIC_RELAXED);   /* written by its thread alone, aligned: never torn */
    atomic_store(&w->reading, 0);
    return p != NULL;
}

/* ---- the watchdog thread ---- */

static char report_buf[64 * 1024];

static int frame_count(const btc_sigsample *s)
{
    return s->n < 0 ? 0 : s->n < BTC_SIGNAL_FRAMES ? s->n : BTC_SIGNAL_FRAMES;
}

static bool same_frame(const btc_frame *a, const btc_frame *b)
{
    return a->addr == b->addr && a->lasti == b->lasti && a->kind == b->kind && a->flags == b->flags;
}

/* How many frames, counted from the outermost, two samples have in common:
 * the stuck call's callers stay where they are while what it runs inside
 * them changes.  Raw frames are compared (a code object by address: the
 * running frames keep it alive; pcs exactly), so a C loop interrupted at
 * another instruction differs in its innermost frame, as its text would. */
static int common_outer(const btc_sigsample *a, const btc_sigsample *b)
{
    int na = frame_count(a), nb = frame_count(b), m = 0;
    while (m < na && m < nb && same_frame(&a->frames[na - 1 - m], &b->frames[nb - 1 - m]))
        m++;
    return m;
}

/* The stack of a report of slot's stuck call: in full the first time;
 * later, against the sample last shown, "the same stack", or only the
 * inner frames that changed (the ~35 lines of a request handler, repeated
 * at every doubling, hid what did change).  In full again when the sample
 * last shown was cut where this one is not: the frames it lacked were
 * never shown, so no later report may point back at it. */
static void add_stack(btc_text *t, stuck_state *s, btc_sigsample *shown, const btc_sigsample *sample,
                      double stuck_for)
{
    if (!s->shown) {
        btc_text_addf(t, "has not switched greenlets for %.1f s; its stack, innermost first:\n", stuck_for);
        btc_sigsample_text(sample, t);
    } else if (shown->partial & ~sample->partial) {
        btc_text_addf(t, "still has not switched greenlets, for %.1f s now; the report at %.1f s was partial: "
                         "its whole stack, innermost first:\n", stuck_for, s->shown_at);
        btc_sigsample_text(sample, t);
    } else {
        int n = frame_count(sample), outer = common_outer(sample, shown);
        btc_text_addf(t, "still has not switched greenlets, for %.1f s now: ", stuck_for);
        if (outer == n && n == frame_count(shown) && sample->partial == shown->partial) {
            btc_text_addf(t, "the same stack as at %.1f s\n", s->shown_at);
            return;   /* keep pointing at the report that has its frames */
        }
        btc_text_addf(t, "its stack changed: the inner %d frame%s (the outer %d as at %.1f s):\n", n - outer,
                      n - outer == 1 ? "" : "s", outer, s->shown_at);
        btc_sigsample_inner_text(sample, n - outer, t);
    }
    *shown = *sample;
    s->shown = true;
    s->shown_at = stuck_for;
}

int btc_test_watchdog_repeat(const btc_sigsample *first, double first_at, const btc_sigsample *then,
                              double then_at, char *buf, size_t size)
{
    stuck_state state = {0};
    btc_sigsample shown;
    btc_text t = {buf, size, 0};
    add_stack(&t, &state, &shown, first, first_at);
    t.len = 0;
    add_stack(&t, &state, &shown, then, then_at);
    return (int)t.len;
}

static void report_stuck(int slot, uint64_t thread, const btc_sigsample *sample, double stuck_for)
{
    btc_text t = {report_buf, sizeof report_buf, 0};
    btc_text_addf(&t, "btcore watchdog: thread %llu ", (unsigned long long)thread);
    if (sample)
        add_stack(&t, &dog.states[slot], &dog.shown[slot], sample, stuck_for);
    else
        btc_text_addf(&t, "has not switched greenlets for %.1f s; its stack, innermost first:\n"
                          "  (the thread did not answer the capture signal)\n", stuck_for);
    btc_text_write(&t, dog.fd);
    atomic_fetch_add(&dog.reports, 1);
}

static void report_recovered(const stuck_state *s, const char *how, double stuck_for)
{
    btc_text t = {report_buf, sizeof report_buf, 0};
    btc_text_addf(&t, "btcore watchdog: thread %llu %s; it was stuck for %.1f s\n",
                  (unsigned long long)s->thread, how, stuck_for);
    btc_text_write(&t, dog.fd);
}

static bool in_code(uintptr_t pc, uintptr_t lo, uintptr_t hi)
{
    return pc - lo < hi - lo;
}

/* Does the thread wait in a C event loop's own code?  The calls inward
 * from the loop's code [wait_lo, wait_hi) (uvloop's own, or a libuv.so it
 * links: libc's epoll_pwait, or the loop between two waits) went through
 * no frame of the interpreter's: a C callback the loop runs (time.sleep
 * given to call_soon) has no Python frame either, but is called through
 * the interpreter's call machinery. */
static bool waits_in_loop(const watched_thread *w, const btc_sigsample *sample, int first_python)
{
    uintptr_t lo = atomic_load(&w->wait_lo), hi = atomic_load(&w->wait_hi);
    for (int i = 0; i < first_python; i++) {
        const btc_frame *f = &sample->frames[i];
        uintptr_t pc = f->flags & BTC_F_EXACT ? f->addr : f->addr - 1;   /* in the call, not after it */
        if (in_code(pc, lo, hi))
            return true;
        if (in_code(pc, atomic_load(&w->interpreter_lo), atomic_load(&w->interpreter_hi)))
            return false;
    }
    return false;
}

/* The index of the sample's innermost Python frame, or -1. */
static int innermost_python(const btc_sigsample *sample)
{
    for (int i = 0; i < sample->n && i < BTC_SIGNAL_FRAMES; i++)
        if (sample->frames[i].kind == BTC_KIND_PYTHON)
            return i;
    return -1;
}

/* Is the sampled thread waiting for events?  Its innermost Python frame is
 * then the slot's idle code: gevent's Hub.run (under the loop's C code), an
 * asyncio loop's selector's select() (over epoll_wait), or for a loop
 * written in C (uvloop: libuv's epoll_pwait under no Python frame of the
 * loop's) the frame that runs the loop, the thread in the loop's own code
 * (waits_in_loop).  A loop running a callback that does not return is
 * stuck, and is reported.  (An asyncio loop moves the switch counter
 * itself: each callback it runs goes through Context.run, which bumps
 * context_ver on entry and exit.) */
static bool idle(int slot, const btc_sigsample *sample)
{
    const watched_thread *w = &watched[slot];
    uintptr_t idle_code = atomic_load(&w->idle_code);
    bool c_loop = atomic_load(&w->wait_lo) != atomic_load(&w->wait_hi);
    int i = innermost_python(sample);
    return i >= 0 && idle_code && sample->frames[i].addr == idle_code && (!c_loop || waits_in_loop(w, sample, i));
}

/* A C loop's sample under the frame that runs it, not idle: the thread may
 * be stuck in a C callback, or only passing through a call of the
 * interpreter's the loop makes between two waits (seen on a loaded
 * machine: its thread preempted there).  An idle loop is in its wait
 * nearly all the time: it is sampled again, IDLE_RESAMPLES times at most,
 * IDLE_RESAMPLE_GAP s apart, and is idle if one of them is. */
#define IDLE_RESAMPLES 3
#define IDLE_RESAMPLE_GAP 0.005

static bool idle_on_second_look(int slot, const btc_sigsample *sample)
{
    const watched_thread *w = &watched[slot];
    int i = innermost_python(sample);
    if (atomic_load(&w->wait_lo) == atomic_load(&w->wait_hi) || i < 0 ||
        sample->frames[i].addr != atomic_load(&w->idle_code))
        return false;
    static btc_sigsample again;   /* the watchdog thread's own, as dog.sample */
    for (int n = 0; n < IDLE_RESAMPLES; n++) {
        struct timespec gap = {0, (long)(IDLE_RESAMPLE_GAP * 1e9)};
        nanosleep(&gap, NULL);
        if (btc_signal_sample_slot(slot, 1000, &again) == 0 && idle(slot, &again))
            return true;
    }
    return false;
}

static void check(int slot, double now)
{
    stuck_state *s = &dog.states[slot];
    uint64_t thread = btc_thread_ident_of(slot), switches = 0;
    bool watched = read_progress(slot, &switches);
    if (!watched || switches != s->seen) {
        if (s->stuck)
            report_recovered(s, watched ? "switched again" : "ended",
                             now - s->since);
        *s = (stuck_state){.seen = switches, .since = now, .next = dog.threshold};
        return;
    }
    double stuck_for = now - s->since;
    if (stuck_for < s->next)
        return;
    bool answered = btc_signal_sample_slot(slot, 1000, &dog.sample) == 0;
    if (!answered && btc_thread_ident_of(slot) != thread) {   /* it ended meanwhile: nothing to report */
        if (s->stuck)
            report_recovered(s, "ended", stuck_for);
        *s = (stuck_state){.since = now, .next = dog.threshold};
        return;
    }
    /* waiting, not stuck: look again in a threshold */
    if (answered && (idle(slot, &dog.sample) || idle_on_second_look(slot, &dog.sample))) {
        if (s->stuck)
            report_recovered(s, "waits for events again", stuck_for);
        *s = (stuck_state){.seen = switches, .since = now, .next = dog.threshold};
        return;
    }
    report_stuck(slot, thread, answered ? &dog.sample : NULL, stuck_for);
    s->stuck = true;
    s->thread = thread;
    s->next = dog.repeat ? s->next * 2 : INFINITY;
}

static void wait_tick(double tick)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double ns = until.tv_nsec + tick * 1e9;
    until.tv_sec += (time_t)(ns / 1e9);
    until.tv_nsec = (long)fmod(ns, 1e9);
    pthread_mutex_lock(&dog.lock);
    if (!dog.stopping)
        pthread_cond_timedwait(&dog.wake, &dog.lock, &until);
    pthread_mutex_unlock(&dog.lock);
}

static void *watchdog_main(void *arg BTC_UNUSED)
{
    double tick = dog.threshold / 4 < 0.1 ? dog.threshold / 4 : 0.1;
    double start = now_s();
    for (int i = 0; i < BTC_WATCHED_THREADS; i++) {
        dog.states[i] = (stuck_state){.since = start, .next = dog.threshold};
        read_progress(i, &dog.states[i].seen);
    }
    bool last = false;
    while (!last) {   /* one pass after stop(): a switch made just before it is still reported */
        wait_tick(tick);
        last = __atomic_load_n(&dog.stopping, __ATOMIC_ACQUIRE);
        double now = now_s();
        for (int i = 0; i < BTC_WATCHED_THREADS; i++)
            check(i, now);
    }
    return NULL;
}

int btc_watchdog_start(double threshold_s, int fd, int repeat)
{
    if (dog.running || !(threshold_s > 0))
        return -1;
    int own_fd = dup(fd);
    if (own_fd < 0)
        return -1;
    dog.threshold = threshold_s;
    dog.fd = own_fd;
    dog.repeat = repeat != 0;
    dog.stopping = false;
    atomic_store(&dog.reports, 0);
    if (btc_own_thread_start(&dog.thread, watchdog_main, NULL) != 0) {
        close(own_fd);
        return -1;
    }
    dog.running = true;
    return 0;
}

int btc_watchdog_stop(void)
{
    if (!dog.running)
        return 0;
    PyThreadState *gil = PyGILState_Check() ? PyEval_SaveThread() : NULL;
    pthread_mutex_lock(&dog.lock);
    __atomic_store_n(&dog.stopping, true, __ATOMIC_RELEASE);
    pthread_cond_signal(&dog.wake);
    pthread_mutex_unlock(&dog.lock);
    pthread_join(dog.thread, NULL);
    if (gil)
        PyEval_RestoreThread(gil);
    close(dog.fd);
    dog.running = false;
    /* Every thread it watched, whichever thread stops it: a later watchdog
     * watches the threads it is asked to, not this one's. */
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        atomic_store(&watched[i].watched, 0);
    return 1;
}

int btc_watchdog_reports(void)
{
    return atomic_load(&dog.reports);
}

/* A forked child has no watchdog thread: it starts stopped. */
static void child_after_fork(void)
{
    if (dog.running)
        close(dog.fd);
    dog.running = false;
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        atomic_store(&watched[i].reading, 0);   /* a read the vanished watchdog thread was making */
    pthread_mutex_init(&dog.lock, NULL);
    pthread_cond_init(&dog.wake, NULL);
}

__attribute__((constructor)) static void watchdog_fork_safe(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}

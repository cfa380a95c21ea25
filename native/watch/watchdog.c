/* The watchdog: a C thread that notices a thread whose greenlets stopped
 * switching and writes its stack while it is still stuck.
 *
 * Switch detection: a greenlet tracer (greenlet.settrace, per thread) made
 * of one C function that counts switches in the thread's slot and notes
 * whether the greenlet switched to is an idle one (gevent's hub, waiting
 * for events, is not stuck).  The watchdog thread reads the counters every
 * tick; a counter that has not moved for the threshold means stuck: it
 * samples the thread through the capture signal (signal_capture.c), names
 * the frames in C (report.c) and writes the report with write(2).  It never
 * takes the GIL: the stuck thread may hold it (a C loop), and the report
 * must come while it is stuck, not after.
 */
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "capture/signal_capture.h"
#include "common/errors.h"
#include "watch/report.h"

/* Written by the watched thread's tracer (GIL held), read by the watchdog. */
typedef struct {
    _Atomic uint64_t switches;
    _Atomic int idle;             /* the greenlet switched to is an idle one */
    _Atomic uintptr_t current;    /* that greenlet (identity and type name only) */
    _Atomic int watched;
    _Atomic uintptr_t thread;     /* the watched thread: a slot reused by another thread is not watched */
    PyObject *previous;           /* the tracer to chain to (GIL) */
    PyTypeObject *idle_type;      /* (GIL) */
} switch_counter;

/* The watchdog thread's own view of each watched thread. */
typedef struct {
    uint64_t seen;
    double since;      /* when seen was first seen */
    double next;       /* report when stuck this long */
    bool stuck;        /* reported, not recovered yet */
    char greenlet[160];   /* the greenlet reported stuck, as text (it may be gone by recovery) */
} stuck_state;

static switch_counter counters[BTC_WATCHED_THREADS];

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
} dog = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the tracer (runs on every switch of a watched thread) ---- */

static PyObject *count_switch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    switch_counter *c = PyCapsule_GetPointer(self, NULL);
    if (!c)
        return NULL;
    if (atomic_load_explicit(&c->watched, memory_order_relaxed)) {
        /* Only this thread writes its counter: a plain increment, published. */
        atomic_store_explicit(&c->switches, atomic_load_explicit(&c->switches, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        if (nargs == 2 && PyTuple_CheckExact(args[1]) && PyTuple_GET_SIZE(args[1]) == 2) {
            PyObject *target = PyTuple_GET_ITEM(args[1], 1);
            atomic_store_explicit(&c->current, (uintptr_t)target, memory_order_relaxed);
            atomic_store_explicit(&c->idle, c->idle_type && PyObject_TypeCheck(target, c->idle_type),
                                  memory_order_relaxed);
        }
    }
    if (c->previous)
        return PyObject_Vectorcall(c->previous, args, (size_t)nargs, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef tracer_def = {"btcore_switch_counter", (PyCFunction)(void (*)(void))count_switch,
                                 METH_FASTCALL, "btcore's watchdog: counts greenlet switches, then chains."};

int btc_watch_thread(uintptr_t namespace, uintptr_t previous, uintptr_t idle_type)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int slot = btc_thread_register();
    PyObject *capsule = NULL, *tracer = NULL;
    if (slot >= 0) {
        switch_counter *c = &counters[slot];
        Py_XSETREF(c->previous, previous ? Py_NewRef((PyObject *)previous) : NULL);
        c->idle_type = (PyTypeObject *)idle_type;
        Py_XINCREF(c->idle_type);   /* kept for good: a class outlives its watch */
        atomic_store(&c->idle, 0);
        atomic_store(&c->current, 0);
        atomic_store(&c->thread, (uintptr_t)pthread_self());
        atomic_store(&c->watched, 1);
        capsule = PyCapsule_New(c, NULL, NULL);
        tracer = capsule ? PyCFunction_New(&tracer_def, capsule) : NULL;
        if (!tracer || PyDict_SetItemString((PyObject *)namespace, "tracer", tracer) < 0)
            slot = btc_fail_python(BTC_E_UNSUPPORTED, "cannot make the switch tracer");
    }
    Py_XDECREF(capsule);
    Py_XDECREF(tracer);
    PyGILState_Release(gil);
    return slot;
}

void btc_unwatch_thread(void)
{
    int slot = btc_thread_slot_self();
    if (slot >= 0)
        atomic_store(&counters[slot].watched, 0);
}

/* ---- the watchdog thread ---- */

static char report_buf[64 * 1024];

static void write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* "greenlet <type object at 0x...>" of g, the greenlet a thread switched to
 * last (0: none seen since it was watched).  Its type's name is read
 * without the GIL while g runs (so is alive), and kept as text. */
static void describe_greenlet(uintptr_t current, char *out, size_t size)
{
    PyObject *g = (PyObject *)current;
    if (g)
        snprintf(out, size, "greenlet <%s object at %p>", Py_TYPE(g)->tp_name, (void *)g);
    else
        snprintf(out, size, "its current greenlet");
}

static void report_stuck(int slot, const char *greenlet, double stuck_for)
{
    btc_text t = {report_buf, sizeof report_buf, 0};
    btc_sigsample sample;
    btc_text_addf(&t, "btcore watchdog: %s", greenlet);
    btc_text_addf(&t, " in thread %llu has not switched for %.1f s; its stack, innermost first:\n",
                  (unsigned long long)btc_thread_ident_of(slot), stuck_for);
    if (btc_signal_sample_slot(slot, 1000, &sample) == 0)
        btc_sigsample_text(&sample, &t);
    else
        btc_text_add(&t, "  (the thread did not answer the capture signal)\n");
    write_all(dog.fd, t.buf, t.len);
    atomic_fetch_add(&dog.reports, 1);
}

static void report_recovered(int slot, const char *greenlet, double stuck_for)
{
    btc_text t = {report_buf, sizeof report_buf, 0};
    btc_text_addf(&t, "btcore watchdog: %s", greenlet);
    btc_text_addf(&t, " in thread %llu switched again; it was stuck for %.1f s\n",
                  (unsigned long long)btc_thread_ident_of(slot), stuck_for);
    write_all(dog.fd, t.buf, t.len);
}

static void check(int slot, double now)
{
    switch_counter *c = &counters[slot];
    stuck_state *s = &dog.states[slot];
    uint64_t switches = atomic_load_explicit(&c->switches, memory_order_relaxed);
    bool watched = atomic_load(&c->watched) && atomic_load(&c->thread) == btc_thread_ident_of(slot);
    if (!watched || switches != s->seen || atomic_load_explicit(&c->idle, memory_order_relaxed)) {
        if (s->stuck)
            report_recovered(slot, s->greenlet, now - s->since);
        *s = (stuck_state){.seen = switches, .since = now, .next = dog.threshold};
        return;
    }
    double stuck_for = now - s->since;
    if (stuck_for < s->next)
        return;
    if (!s->stuck)
        describe_greenlet(atomic_load_explicit(&c->current, memory_order_relaxed), s->greenlet,
                          sizeof s->greenlet);
    report_stuck(slot, s->greenlet, stuck_for);
    s->stuck = true;
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
    for (int i = 0; i < BTC_WATCHED_THREADS; i++)
        dog.states[i] = (stuck_state){.seen = atomic_load(&counters[i].switches), .since = start,
                                      .next = dog.threshold};
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
    /* The thread blocks every signal: process signals go to Python's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&dog.thread, NULL, watchdog_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
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
    pthread_mutex_init(&dog.lock, NULL);
    pthread_cond_init(&dog.wake, NULL);
}

__attribute__((constructor)) static void watchdog_fork_safe(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}

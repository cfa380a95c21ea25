/* The process's OS threads as the interpreter knows them, and which of them
 * owns a greenlet's stack.
 *
 * Under monkey-patching (gevent, eventlet) threading.get_ident() is the
 * current greenlet's id and threading.enumerate() lists patched or dummy
 * entries: the thread states and pthread_self() are what stays true.  A
 * greenlet never changes threads and every greenlet of a thread runs on that
 * thread's stack, so an address inside a greenlet's stack
 * (btc_greenlet_stack_mark) names its thread exactly: the thread whose stack
 * range contains it.  GIL held throughout (the thread list is the
 * interpreter's: a thread removes its state, with the GIL, before it ends).
 */
#include <Python.h>
#include <limits.h>
#include <pthread.h>
#include <time.h>

#include "capture/capture.h"
#include "capture/cpython/pyframes.h"
#include "common/builtins.h"

uint64_t btc_os_thread_self(void)
{
    return (uint64_t)pthread_self();
}

PyThreadState *btc_thread_state_of(uint64_t ident)
{
    if (!PyGILState_Check())
        return NULL;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); ts; ts = PyThreadState_Next(ts))
        if ((uint64_t)ts->thread_id == ident)
            return ts;
    return NULL;
}

static int64_t cpu_ns_of(const PyThreadState *ts)
{
    if (!ts || ts->native_thread_id == 0 || ts->native_thread_id > INT_MAX)
        return -1;
    /* The kernel's CPU clock of one thread (MAKE_THREAD_CPUCLOCK(tid,
     * CPUCLOCK_SCHED) of linux/posix-timers.h: ~tid << 3 | PERTHREAD 4 |
     * SCHED 2), refused for a thread outside this process: a tid reused
     * since reads another of its threads, whose count differs. */
    clockid_t clock = (clockid_t)(~(unsigned)ts->native_thread_id << 3 | 6u);
    struct timespec t;
    return clock_gettime(clock, &t) == 0 ? (int64_t)t.tv_sec * 1000000000 + t.tv_nsec : -1;
}

int64_t btc_thread_cpu_ns(uint64_t ident)
{
    return cpu_ns_of(btc_thread_state_of(ident));
}

/* _thread_clocks(): {ident: (CPU ns or -1, switch count)} of every thread of
 * the interpreter but the caller that runs Python code (has a frame), in one
 * pass: the profiler reads both for every thread at every tick, and asked
 * sys._current_frames() for the list (a frame object made for each thread)
 * and each thread's clock and count apart (each a walk of the thread
 * states).  The switch count is the thread state's context_ver, as
 * btc_thread_switch_count (watch/watchdog.c, which says why) reads it.
 *
 * The states are read first, into plain memory, and the objects made after:
 * an allocation may collect (3.11 collects inside it), and the finalizers
 * a collection runs are Python code, which may hand the GIL to a thread
 * that then ends and frees its state, the one a walk would stand on (a
 * SIGSEGV, tests/test_threads.py). */
typedef struct {
    unsigned long long ident, switches;
    long long cpu_ns;
} thread_clock;

static int read_clocks(PyThreadState *me, thread_clock *out, int max)
{
    int n = 0;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(me->interp); t && n < max; t = PyThreadState_Next(t)) {
        btc_pycursor top;
        btc_py_cursor_thread(&top, t);
        if (t != me && t->thread_id && top.frame)
            out[n++] = (thread_clock){t->thread_id, t->context_ver, (long long)cpu_ns_of(t)};
    }
    return n;
}

static PyObject *thread_clocks(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    PyThreadState *me = PyThreadState_Get();
    int max = 0;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(me->interp); t; t = PyThreadState_Next(t))
        max++;
    thread_clock *clocks = PyMem_RawMalloc((size_t)max * sizeof *clocks + 1);   /* (runs no Python code) */
    if (!clocks)
        return PyErr_NoMemory();
    int n = read_clocks(me, clocks, max);
    PyObject *out = PyDict_New();
    for (int i = 0; out && i < n; i++) {
        PyObject *key = PyLong_FromUnsignedLongLong(clocks[i].ident);
        PyObject *value = Py_BuildValue("(LK)", clocks[i].cpu_ns, clocks[i].switches);
        if (!key || !value || PyDict_SetItem(out, key, value) < 0)
            Py_CLEAR(out);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    PyMem_RawFree(clocks);
    return out;
}

static PyMethodDef thread_clocks_def = {"_thread_clocks", thread_clocks, METH_NOARGS,
                                        "_thread_clocks(): {ident: (CPU ns, switch count)} of the other threads."};

int btc_install_thread_clocks(uintptr_t namespace)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = btc_put_builtin((PyObject *)namespace, &thread_clocks_def);
    PyGILState_Release(gil);
    return rc;
}

int btc_os_threads(btc_os_thread *out, int max)
{
    PyThreadState *me = PyGILState_GetThisThreadState();
    if (!me || max < 0)
        return -1;
    int n = 0;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(me->interp); t && n < max; t = PyThreadState_Next(t)) {
        if (!t->thread_id)
            continue;   /* a state not bound to a thread yet */
        btc_os_thread *o = &out[n++];
        o->ident = t->thread_id;
        o->native_id = (int64_t)t->native_thread_id;
        o->stack_lo = o->stack_hi = 0;   /* unknown: that thread is then matched by other means */
        if (t == me)
            btc_thread_stack(&o->stack_lo, &o->stack_hi);
        else
            btc_pthread_stack((pthread_t)t->thread_id, &o->stack_lo, &o->stack_hi);
    }
    return n;
}

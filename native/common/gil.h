/* The GIL around entry points that read and decode files.
 *
 * btcore's cffi wrappers keep the GIL (see btcore/_build.py): capture needs
 * it.  Symbolization does not, and may read and decode debug data for tens
 * of milliseconds, so those entry points hand the GIL over while they work.
 * Release it before taking any btcore mutex and take it back only after
 * releasing the mutex: a thread holding the GIL may be waiting for that
 * mutex (capture takes the GIL first, then the module lock). */
#ifndef BTC_GIL_H
#define BTC_GIL_H

#include <Python.h>

/* NULL when the calling thread did not hold the GIL (a plain C caller). */
static inline PyThreadState *btc_gil_release(void)
{
    return PyGILState_Check() ? PyEval_SaveThread() : NULL;
}

static inline void btc_gil_restore(PyThreadState *saved)
{
    if (saved)
        PyEval_RestoreThread(saved);
}

#endif

/* What a weak reference refers to, read from the object itself. */
#ifndef BTC_REFERENT_H
#define BTC_REFERENT_H

#include <Python.h>

/* What weak reference `ref` refers to, borrowed, or NULL if it is gone or
 * dying and its callback has not run yet.  Read from the object, not with
 * PyWeakref_GetObject (gone in 3.15) or PyWeakref_GetRef (3.13+, a new
 * reference we would only drop): a live referent stays alive while the
 * caller uses it (with the GIL held), and no Python code runs. */
static inline PyObject *btc_referent(void *ref)
{
    PyObject *object = ((PyWeakReference *)ref)->wr_object;
    return object != Py_None && Py_REFCNT(object) > 0 ? object : NULL;
}

#endif

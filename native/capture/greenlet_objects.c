/* Which of a list of objects are greenlets: the filter of introspect.py's
 * gc scans (live_greenlets(): the whole heap, for a snapshot; the profiler:
 * the gc's young generation, at every tick).
 *
 * In C because the profiler runs it at every tick: a busy gunicorn worker's
 * young generation holds ~1,000 objects, and Python's filter
 * (issubclass(type(obj), greenlet.greenlet) per object) took ~240 us of its
 * ~430 us tick; here an object costs a few ns.  PyObject_TypeCheck reads the
 * type's MRO only: no code of the object runs (isinstance() would ask a
 * proxy object for its __class__, which may run and raise anything). */
#include <Python.h>

#include "btcore_api.h"
#include "common/builtins.h"

static PyTypeObject *greenlet_type;

/* _greenlets_among(objects): the greenlets of the list objects, in order. */
static PyObject *greenlets_among(PyObject *self, PyObject *objects)
{
    (void)self;
    if (!PyList_Check(objects))
        return PyErr_Format(PyExc_TypeError, "_greenlets_among() takes a list, not %s", Py_TYPE(objects)->tp_name);
    PyObject *found = PyList_New(0);
    for (Py_ssize_t i = 0; found && i < PyList_GET_SIZE(objects); i++) {
        PyObject *o = PyList_GET_ITEM(objects, i);
        if (PyObject_TypeCheck(o, greenlet_type) && PyList_Append(found, o) < 0)
            Py_CLEAR(found);
    }
    return found;
}

static PyMethodDef greenlets_among_def = {"_greenlets_among", greenlets_among, METH_O,
                                          "_greenlets_among(objects): the greenlets of the list, in order."};

int btc_install_greenlets_among(uintptr_t namespace, uintptr_t greenlet)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = PyType_Check((PyObject *)greenlet) ? btc_put_builtin((PyObject *)namespace, &greenlets_among_def) : -1;
    if (rc == 0)
        Py_XSETREF(greenlet_type, (PyTypeObject *)Py_NewRef((PyObject *)greenlet));
    PyGILState_Release(gil);
    return rc;
}

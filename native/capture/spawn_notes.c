/* Exception notes, greenlet's side: when an exception escapes a greenlet's
 * run function, the greenlet dies and greenlet raises the exception in its
 * parent, out of the switch() or throw() call that had resumed the greenlet.
 * That call is where the note is added, for a plain greenlet (`g.switch()`)
 * and for eventlet (its hub resumes a green thread with `g.switch`).
 *
 * Why there.  Greenlet runs no Python hook when a run function raises.  The
 * alternatives cost on paths where nothing fails: wrapping run at spawn
 * time allocates a wrapper per greenlet; greenlet.settrace calls a function
 * on every switch.  Here the methods switch and throw of greenlet.greenlet's
 * type dict are replaced by descriptors whose C functions call greenlet's own
 * and look at the result: a switch that returns costs one more direct C
 * call and a test of the result, nothing else.  Only a call that raises does
 * more: if the greenlet it was made on is now dead, the exception escaped that
 * greenlet, and the note function (Python, btcore/spawn_notes.py) is called
 * with the exception and the greenlet, the exception state saved around it.
 *
 * Not seen: greenlet's C API (PyGreenlet_Switch: gevent's own switches, whose
 * greenlets catch their errors and report them through Hub.handle_error,
 * patched in Python instead), bound methods taken before enabling, and an
 * exception that reaches a parent suspended in a switch to another greenlet
 * than the one that died.
 *
 * Everything runs with the GIL held; no state but the pointers below.
 */
#include <Python.h>

#include <stdbool.h>

#include "btcore_api.h"

static PyTypeObject *type;               /* greenlet.greenlet */
static PyObject *orig_switch, *orig_throw; /* its method descriptors, restored when off */
static PyCFunctionWithKeywords switch_impl;
static PyCFunction throw_impl;
static PyObject *dead_descr;             /* greenlet's own `dead` getter (a subclass may shadow it) */
static PyObject *note_fn;                /* note(exception, greenlet); NULL: off */

/* Is g dead?  Read through greenlet's own getter; false on any failure. */
static bool is_dead(PyObject *g)
{
    PyObject *dead = Py_TYPE(dead_descr)->tp_descr_get(dead_descr, g, (PyObject *)type);
    bool yes = dead == Py_True;
    Py_XDECREF(dead);
    return yes;
}

/* The call on g raised: if g died, the exception escaped it.  The note
 * function's own failures are not the caller's: its exception stays. */
static void escaped(PyObject *g)
{
    if (!note_fn)
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v && tb)
        PyException_SetTraceback(v, tb);
    if (v && is_dead(g)) {
        PyObject *fn = Py_NewRef(note_fn);   /* turning notes off inside the call frees nothing in use */
        PyObject *r = PyObject_CallFunctionObjArgs(fn, v, g, NULL);
        Py_XDECREF(r);
        Py_DECREF(fn);
    }
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
}

static PyObject *noted_switch(PyObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *r = switch_impl(self, args, kwargs);
    if (!r)
        escaped(self);
    return r;
}

static PyObject *noted_throw(PyObject *self, PyObject *args)
{
    PyObject *r = throw_impl(self, args);
    if (!r)
        escaped(self);
    return r;
}

static PyMethodDef switch_def = {"switch", (PyCFunction)(void (*)(void))noted_switch,
                                 METH_VARARGS | METH_KEYWORDS, NULL};
static PyMethodDef throw_def = {"throw", noted_throw, METH_VARARGS, NULL};

/* greenlet's method `name`, checked to be a C method with `flags`, or NULL. */
static PyObject *original(const char *name, int flags)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name);
    if (!d || !PyObject_TypeCheck(d, &PyMethodDescr_Type))
        return NULL;
    PyMethodDef *def = ((PyMethodDescrObject *)d)->d_method;
    return def->ml_flags == flags ? d : NULL;
}

/* Learn greenlet's switch, throw and dead, once; false if they are not as
 * greenlet 1.x-3.x make them. */
static bool learn(PyTypeObject *greenlet)
{
    if (type)
        return type == greenlet;
    if (!PyType_Check((PyObject *)greenlet))
        return false;
    type = greenlet;
    PyObject *sw = original("switch", METH_VARARGS | METH_KEYWORDS), *th = original("throw", METH_VARARGS);
    PyObject *dead = PyDict_GetItemString(greenlet->tp_dict, "dead");
    if (!sw || !th || !dead || !Py_TYPE(dead)->tp_descr_get) {
        type = NULL;
        return false;
    }
    orig_switch = Py_NewRef(sw);
    orig_throw = Py_NewRef(th);
    dead_descr = Py_NewRef(dead);
    switch_impl = (PyCFunctionWithKeywords)(void (*)(void))((PyMethodDescrObject *)sw)->d_method->ml_meth;
    throw_impl = ((PyMethodDescrObject *)th)->d_method->ml_meth;
    switch_def.ml_doc = ((PyMethodDescrObject *)sw)->d_method->ml_doc;
    throw_def.ml_doc = ((PyMethodDescrObject *)th)->d_method->ml_doc;
    return true;
}

static int put(const char *name, PyObject *descr)
{
    return descr ? PyDict_SetItemString(type->tp_dict, name, descr) : -1;
}

int btc_spawn_notes(uintptr_t greenlet, uintptr_t note)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    if (learn((PyTypeObject *)greenlet)) {
        PyObject *sw = note ? PyDescr_NewMethod(type, &switch_def) : Py_NewRef(orig_switch);
        PyObject *th = note ? PyDescr_NewMethod(type, &throw_def) : Py_NewRef(orig_throw);
        if (sw && th && put("switch", sw) == 0 && put("throw", th) == 0) {
            Py_XSETREF(note_fn, note ? Py_NewRef((PyObject *)note) : NULL);
            rc = 0;
        } else {   /* never half on */
            Py_CLEAR(note_fn);
            put("switch", orig_switch);
            put("throw", orig_throw);
        }
        PyType_Modified(type);   /* method caches of greenlet and every subclass */
        Py_XDECREF(sw);
        Py_XDECREF(th);
    }
    PyErr_Clear();
    PyGILState_Release(gil);
    return rc;
}

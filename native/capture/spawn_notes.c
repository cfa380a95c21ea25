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
 * greenlet, and gets the note of its spawn chain, the exception state saved
 * around it.  The notes' texts are kept per chain by capture/spawn_notes.py
 * (_rendered, keyed by btc_spawn_chain_key): a kept text is added here, in
 * C (an escaping exception's whole cost is the 2 us budget); only a chain's
 * first failure calls Python's render function.
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
#include "capture/spawn.h"
#include "common/builtins.h"

static PyTypeObject *type;               /* greenlet.greenlet */
static PyObject *orig_switch, *orig_throw; /* its method descriptors, restored when off */
static PyCFunctionWithKeywords switch_impl;
static PyCFunction throw_impl;
static PyObject *dead_descr;             /* greenlet's own `dead` getter (a subclass may shadow it) */
static PyObject *render_fn;              /* render(exception, greenlet, key); NULL: off */
static PyObject *notes_module;           /* capture/spawn_notes.py's globals: its NOTE_HEADER and _rendered */
static PyObject *add_note_name, *notes_name;

/* Is g dead?  Read through greenlet's own getter; false on any failure. */
static bool is_dead(PyObject *g)
{
    PyObject *dead = Py_TYPE(dead_descr)->tp_descr_get(dead_descr, g, (PyObject *)type);
    bool yes = dead == Py_True;
    Py_XDECREF(dead);
    return yes;
}

/* exc's attribute __notes__ (a new reference, NULL if it has none), as
 * getattr(exc, "__notes__", None) reads it; -1 on another error. */
static int get_notes(PyObject *exc, PyObject **notes)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(exc, notes_name, notes);
#else
    return _PyObject_LookupAttr(exc, notes_name, notes);
#endif
}

/* Does exc carry a spawn chain's note already (it escaped a greenlet spawned
 * by the one now dying, whose chain contains this one)?  -1 on error. */
static int has_chain_note(PyObject *exc, PyObject *header)
{
    PyObject *notes;
    if (get_notes(exc, &notes) < 0)
        return -1;
    int found = 0;
    for (Py_ssize_t i = 0; notes && PyList_Check(notes) && i < PyList_GET_SIZE(notes) && !found; i++) {
        PyObject *note = PyList_GET_ITEM(notes, i);
        found = PyUnicode_Check(note) && PyUnicode_Tailmatch(note, header, 0, PY_SSIZE_T_MAX, -1) == 1;
    }
    Py_XDECREF(notes);
    return found;
}

/* Note exc, which escaped g, with g's spawn chain if its text is kept.
 * Returns None when that is done, or when there is nothing to note (exc is
 * no exception or carries a chain already, g is untracked); else a new
 * reference to the key under which the text, rendered by the caller, is to
 * be kept; NULL with an exception set on error. */
static PyObject *note_if_kept(PyObject *exc, PyObject *g)
{
    /* Held: the __notes__ lookup (a property) and the key's allocations (a
     * collection's finalizers) run Python code, which may rebind the
     * module's globals and free what a borrowed reference points to. */
    PyObject *header = Py_XNewRef(PyDict_GetItemString(notes_module, "NOTE_HEADER"));
    PyObject *kept = Py_XNewRef(PyDict_GetItemString(notes_module, "_rendered"));
    int noted = -1;
    if (!header || !PyUnicode_Check(header) || !kept || !PyDict_Check(kept))
        PyErr_Format(PyExc_RuntimeError, "btcore.capture.spawn_notes has no NOTE_HEADER str or _rendered dict");
    else
        noted = PyExceptionInstance_Check(exc) ? has_chain_note(exc, header) : 1;
    Py_XDECREF(header);
    PyObject *key = noted ? NULL : btc_spawn_chain_key(g);
    PyObject *text = key && key != Py_None ? Py_XNewRef(PyDict_GetItemWithError(kept, key)) : NULL;
    Py_XDECREF(kept);
    if (noted)
        return noted < 0 ? NULL : Py_NewRef(Py_None);
    if (!key || key == Py_None)
        return key;
    if (!text)
        return PyErr_Occurred() ? (Py_DECREF(key), NULL) : key;
    Py_DECREF(key);
    PyObject *r = PyObject_CallMethodOneArg(exc, add_note_name, text);
    Py_DECREF(text);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* The call on g raised: if g died, the exception escaped it.  Noting's own
 * failures are not the caller's: its exception stays. */
static void escaped(PyObject *g)
{
    if (!render_fn)
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v && tb)
        PyException_SetTraceback(v, tb);
    if (v && is_dead(g)) {
        PyObject *key = note_if_kept(v, g);
        if (key && key != Py_None) {
            PyObject *fn = Py_NewRef(render_fn);   /* turning notes off inside the call frees nothing in use */
            Py_XDECREF(PyObject_CallFunctionObjArgs(fn, v, g, key, NULL));
            Py_DECREF(fn);
        }
        Py_XDECREF(key);
    }
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
}

/* _note_if_kept(exc, g): note_if_kept for capture/spawn_notes.py (gevent's errors). */
static PyObject *note_if_kept_builtin(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "_note_if_kept(exception, greenlet) takes 2 arguments");
    return note_if_kept(args[0], args[1]);
}

static PyMethodDef note_if_kept_def = {
    "_note_if_kept", (PyCFunction)(void (*)(void))note_if_kept_builtin, METH_FASTCALL,
    "_note_if_kept(exception, greenlet): None if noted from the kept texts (or nothing to note), "
    "else the key its rendered text is to be kept under."};

int btc_spawn_notes_install(uintptr_t namespace)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    if (!add_note_name)
        add_note_name = PyUnicode_InternFromString("add_note");
    if (!notes_name)
        notes_name = PyUnicode_InternFromString("__notes__");
    int rc = add_note_name && notes_name ? btc_put_builtin((PyObject *)namespace, &note_if_kept_def) : -1;
    if (rc == 0)
        Py_XSETREF(notes_module, Py_NewRef((PyObject *)namespace));   /* a reloaded module's globals replace the old ones */
    PyErr_Clear();
    PyGILState_Release(gil);
    return rc;
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

int btc_spawn_notes(uintptr_t greenlet, uintptr_t render)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = -1;
    if (learn((PyTypeObject *)greenlet)) {
        PyObject *sw = render ? PyDescr_NewMethod(type, &switch_def) : Py_NewRef(orig_switch);
        PyObject *th = render ? PyDescr_NewMethod(type, &throw_def) : Py_NewRef(orig_throw);
        if (sw && th && put("switch", sw) == 0 && put("throw", th) == 0) {
            Py_XSETREF(render_fn, render ? Py_NewRef((PyObject *)render) : NULL);
            rc = 0;
        } else {   /* never half on */
            Py_CLEAR(render_fn);
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

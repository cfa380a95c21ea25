/* btcore.collect() as a CPython builtin, for its common calls.
 *
 * A Python-level collect() costs about as much as the capture itself (a
 * call with keyword arguments, a cffi call, the checks).  This builtin takes
 * the calls with plain arguments (target None or a greenlet once greenlet's
 * layout is learned; limit None or an int; capacity an int in range;
 * python, native, internals True or False) and does them in C; every other
 * call — unusual argument types, any error (a greenlet running in another
 * thread, ...), the first capture that needs greenlet's layout learned — is
 * handed to the Python implementation, which validates and raises exactly
 * as documented.  Being a builtin, it adds no Python frame to hide.
 */
#include <Python.h>

#include "capture/capture.h"
#include "capture/greenlet_context.h"

static PyObject *python_collect;   /* btcore.capture.backtrace's collect(), for every other call */
static PyObject *backtrace_error;  /* btcore.BacktraceError, held: at shutdown its module global is gone */
static PyTypeObject *backtrace_type;
static PyObject *kw_target, *kw_limit, *kw_python, *kw_native, *kw_capacity, *kw_internals;

static bool small_int(PyObject *v, long lo, long hi, int *out)
{
    if (!PyLong_CheckExact(v))
        return false;
    int overflow;
    long x = PyLong_AsLongAndOverflow(v, &overflow);
    if (overflow || x < lo || x > hi)
        return false;
    *out = (int)x;
    return true;
}

/* A keyword argument the fast path understands: false means "let Python do it". */
static bool take_keyword(PyObject *key, PyObject *v, int *capacity, int *limit, int *want)
{
    int flag = 0;
    if (key == kw_capacity)
        return small_int(v, 1, BTC_MAX_CAPACITY, capacity);
    if (key == kw_limit)
        return v == Py_None || small_int(v, 0, INT_MAX, limit);
    if (v != Py_True && v != Py_False)
        return false;
    if (key == kw_python)
        flag = BTC_WANT_PYTHON;
    else if (key == kw_native)
        flag = BTC_WANT_NATIVE;
    else if (key == kw_internals)
        flag = BTC_WANT_INTERNALS;   /* in a greenlet: its start-up frames */
    else
        return false;
    *want = v == Py_True ? (*want | flag) : (*want & ~flag);
    return true;
}

/* At interpreter shutdown, modules are torn down (their globals set to
 * None) while objects that may still capture are finalized: the Python
 * implementation would fail there with a TypeError. */
static bool python_impl_torn_down(void)
{
    PyObject *globals = PyFunction_GetGlobals(python_collect);
    PyObject *core = globals && PyDict_Check(globals) ? PyDict_GetItemString(globals, "_btc_collect") : NULL;
    return !core || core == Py_None;
}

static PyObject *collect_builtin(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    (void)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int capacity = BTC_DEFAULT_CAPACITY, limit = -1, want = BTC_WANT_PYTHON | BTC_WANT_NATIVE;
    PyObject *target = nargs == 1 ? args[0] : Py_None;
    bool plain = nargs <= 1;
    for (Py_ssize_t i = 0; plain && i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        if (key == kw_target) {
            target = args[nargs + i];
            plain = nargs == 0;   /* given twice: Python raises the TypeError */
        } else {
            plain = take_keyword(key, args[nargs + i], &capacity, &limit, &want);
        }
    }
    uintptr_t address = 0;   /* the calling thread's own stack */
    if (plain && target != Py_None) {
        switch (btc_greenlet_target(target)) {
        case BTC_TARGET_CURRENT: break;
        case BTC_TARGET_GREENLET: address = (uintptr_t)target; break;
        default: plain = false;
        }
    }
    if (plain && (want & (BTC_WANT_PYTHON | BTC_WANT_NATIVE))) {
        PyObject *bt = backtrace_type->tp_alloc(backtrace_type, 0);
        if (!bt)
            return NULL;
        if (limit < 0 || limit > capacity)
            limit = capacity;
        if (btc_collect(address, (uintptr_t)bt, capacity, limit, want) == 0) {
            if (target != Py_None)
                btc_backtrace_remember_target(bt, target);
            return bt;
        }
        Py_DECREF(bt);   /* an error, or greenlet's layout to learn: Python's turn */
    }
    if (python_impl_torn_down()) {
        PyErr_SetString(backtrace_error, "btcore cannot capture during interpreter shutdown: "
                                         "its modules are already torn down");
        return NULL;
    }
    return PyObject_Vectorcall(python_collect, args, nargsf, kwnames);
}

/* ml_doc: the Python implementation's signature and docstring, given at
 * install (help() and inspect.signature() read them from here). */
static PyMethodDef collect_def = {
    "collect", (PyCFunction)(void (*)(void))collect_builtin, METH_FASTCALL | METH_KEYWORDS, NULL};

static PyObject *intern(const char *s)
{
    return PyUnicode_InternFromString(s);
}

int btc_install_collect(uintptr_t module, uintptr_t python_impl, uintptr_t backtrace, const char *doc)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *mod = (PyObject *)module, *name = NULL;
    int rc = -1;
    static char *owned_doc;   /* lives as long as the process: every collect() object points at it */
    if (!owned_doc && !(owned_doc = strdup(doc)))
        goto out;
    collect_def.ml_doc = owned_doc;
    if (!(kw_target = intern("target")) || !(kw_limit = intern("limit")) || !(kw_python = intern("python")) ||
        !(kw_native = intern("native")) || !(kw_capacity = intern("capacity")) ||
        !(kw_internals = intern("internals")) || !PyModule_Check(mod) || !PyType_Check((PyObject *)backtrace) ||
        !(name = PyModule_GetNameObject(mod)))
        goto out;
    /* Bound to its module, as a module's own builtins are: the text
     * signature's $module is then not shown as a parameter. */
    PyObject *fn = PyCFunction_NewEx(&collect_def, mod, name);
    if (!fn)
        goto out;
    if (!(backtrace_error = PyObject_GetAttrString(mod, "BacktraceError")))
        goto out;
    python_collect = Py_NewRef((PyObject *)python_impl);
    backtrace_type = (PyTypeObject *)Py_NewRef((PyObject *)backtrace);
    rc = PyObject_SetAttrString(mod, "collect", fn);
    Py_DECREF(fn);
out:
    Py_XDECREF(name);
    if (rc < 0)
        PyErr_Clear();
    PyGILState_Release(gil);
    return rc;
}

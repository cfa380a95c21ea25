/* Python builtins that btcore puts into its modules' namespaces: the form
 * of an entry point that takes or returns Python objects (a cffi entry point
 * passes numbers), installed once at import by the module that uses it. */
#ifndef BTC_BUILTINS_H
#define BTC_BUILTINS_H

#include <Python.h>

/* namespace[def->ml_name] = the builtin def.  0, or -1 (error cleared). */
static inline int btc_put_builtin(PyObject *namespace, PyMethodDef *def)
{
    PyObject *fn = PyDict_Check(namespace) ? PyCFunction_New(def, NULL) : NULL;
    int rc = fn ? PyDict_SetItemString(namespace, def->ml_name, fn) : -1;
    Py_XDECREF(fn);
    if (rc < 0)
        PyErr_Clear();
    return rc;
}

#endif

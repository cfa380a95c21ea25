/* Errors: the reason for the last failure, per thread (btc_last_error()). */
#include <Python.h>

#include "common/errors.h"

static __thread const char *last_error = "";

int btc_fail(int code, const char *reason)
{
    last_error = reason;
    return code;
}

const char *btc_last_error(void) { return last_error; }

int btc_fail_python(int code, const char *what)
{
    static __thread char text[256];
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *shown = value ? PyObject_Str(value) : NULL;
    const char *detail = shown ? PyUnicode_AsUTF8(shown) : NULL;
    snprintf(text, sizeof text, "%s: %s: %s", what, type ? ((PyTypeObject *)type)->tp_name : "?",
             detail ? detail : "?");
    PyErr_Clear();   /* from PyObject_Str, if it failed: the original is what we report */
    Py_XDECREF(shown);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return btc_fail(code, text);
}

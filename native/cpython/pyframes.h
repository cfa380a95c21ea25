/* What the rest of the core needs from one CPython version family.
 *
 * Exactly one unit in native/cpython/ implements this for the Python the
 * module is compiled against (each unit compiles to nothing on other
 * versions; unsupported.c covers the rest).  Adding a version family means
 * adding one unit and one BTC_PY_FAMILY line below.
 * Every function here is called with the GIL held.
 */
#ifndef BTC_PYFRAMES_H
#define BTC_PYFRAMES_H

#include <Python.h>

#include "../btcore.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define BTC_PY_FAMILY 311
#else
#define BTC_PY_FAMILY 0
#endif

/* A position in a thread's chain of interpreter frames. */
typedef struct {
    const void *frame;
} btc_pycursor;

typedef struct {
    PyObject *code;     /* borrowed */
    int lasti;          /* instruction offset in bytes */
    bool entry;         /* the first frame of its eval-loop call: the merge's boundary */
    bool hidden;        /* not shown by tracebacks either (not started yet) */
} btc_pyframe;

/* False (with btc_fail() called) when this build cannot read frames. */
bool btc_py_supported(void);
/* The calling thread's innermost frame. */
void btc_py_cursor_current(btc_pycursor *c);
/* The chain from a frame object (a suspended greenlet's gr_frame); false
 * if frame is not a frame object. */
bool btc_py_cursor_frame(btc_pycursor *c, PyObject *frame);
/* Step to the next (outer) frame; false at the end of the chain. */
bool btc_py_next(btc_pycursor *c, btc_pyframe *f);
/* Names of the C functions that run the eval loop (NULL-terminated). */
extern const char *const btc_py_eval_functions[];

#endif

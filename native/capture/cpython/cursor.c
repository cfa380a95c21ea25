/* The cursor constructors that read no field a family changed: shared by
 * every family unit (since 3.11 a frame object points at its
 * _PyInterpreterFrame through f_frame). */
#include "pyframes.h"

void btc_py_cursor_current(btc_pycursor *c)
{
    btc_py_cursor_thread(c, PyThreadState_Get());
}

#if BTC_PY_FAMILY != 0

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>   /* struct _frame */

bool btc_py_cursor_frame(btc_pycursor *c, PyObject *frame)
{
    *c = (btc_pycursor){.frame = btc_py_interpreter_frame(frame)};
    return c->frame != NULL;
}

const void *btc_py_interpreter_frame(PyObject *frame)
{
    return PyFrame_Check(frame) ? ((PyFrameObject *)frame)->f_frame : NULL;
}

#else

const void *btc_py_interpreter_frame(PyObject *frame) { (void)frame; return NULL; }

#endif

#if BTC_PY_FAMILY == 0
uintptr_t btc_py_eval_call_address(const void *frame) { (void)frame; return 0; }
int btc_py_chain_proof(const void *stop, uintptr_t *out, int max) { (void)stop, (void)out, (void)max; return -1; }
bool btc_py_chain_proven(const void *stop, const uintptr_t *proof, int n) { (void)stop, (void)proof, (void)n; return false; }
const void *btc_py_current_instr(void) { return NULL; }
#endif

/* CPython 3.12 (built by construction, NOT tested: see docs/platforms.md):
 * tstate->cframe->current_frame; f_code; prev_instr (the last instruction
 * run, the LASTI base as in 3.11); shim frames owned by
 * FRAME_OWNED_BY_CSTACK, as in 3.13.  See chain.h. */
#include "pyframes.h"

#if BTC_PY_FAMILY == 312

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>

_Static_assert(FRAME_OWNED_BY_CSTACK == 3, "3.12's shim owner");

#define BTC_FRAME_CODE(f) ((PyObject *)(f)->f_code)
#define BTC_FRAME_INSTR(f) ((f)->prev_instr)
#define btc_thread_frame(ts) ((ts)->cframe ? (ts)->cframe->current_frame : NULL)

#include "chain.h"

#endif

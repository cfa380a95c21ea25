/* CPython 3.13: tstate->current_frame; f_executable is a PyObject *; the
 * eval loop's shim frames are owned by FRAME_OWNED_BY_CSTACK (see chain.h). */
#include "pyframes.h"

#if BTC_PY_FAMILY == 313

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>

_Static_assert(FRAME_OWNED_BY_CSTACK == 3, "3.13's shim owner");

#define BTC_FRAME_CODE(f) ((f)->f_executable)
#define BTC_FRAME_INSTR(f) ((f)->instr_ptr)
#define btc_thread_frame(ts) ((ts)->current_frame)

#include "chain.h"

#endif

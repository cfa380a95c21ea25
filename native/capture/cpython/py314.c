/* CPython 3.14 and 3.15: tstate->current_frame; f_executable is a
 * _PyStackRef (a tagged pointer); the eval loop's shim frames are owned by
 * FRAME_OWNED_BY_INTERPRETER (3.14 renumbered the owners and 3.15 dropped
 * FRAME_OWNED_BY_CSTACK; 3.15 also ends each chain with tstate->base_frame,
 * owned by the interpreter too).  See chain.h. */
#include "pyframes.h"

#if BTC_PY_FAMILY == 314

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>               /* struct _frame */
#include <internal/pycore_interpframe_structs.h> /* _PyInterpreterFrame, owners */
#include <internal/pycore_stackref.h>            /* PyStackRef_AsPyObjectBorrow */

_Static_assert(FRAME_OWNED_BY_INTERPRETER == 3, "3.14+'s shim owner");

#define BTC_FRAME_CODE(f) PyStackRef_AsPyObjectBorrow((f)->f_executable)
#define BTC_FRAME_INSTR(f) ((f)->instr_ptr)
#define btc_thread_frame(ts) ((ts)->current_frame)

#include "chain.h"

#endif

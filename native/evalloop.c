/* Where the interpreter's eval loop code lies: the native frames the merge
 * replaces with Python frames.
 *
 * The version unit names the eval-loop functions; their ranges (with gcc's
 * .cold/.part clones) come from the interpreter module's symbol table. */
#include <Python.h>

#include "btcore.h"
#include "cpython/pyframes.h"

#define MAX_EVAL_RANGES 16
static uintptr_t eval_lo[MAX_EVAL_RANGES], eval_hi[MAX_EVAL_RANGES];
static int n_eval = -1;   /* -1: not looked up yet */

void btc_eval_ranges_init(void)
{
    if (n_eval >= 0)
        return;
    n_eval = 0;
    /* Any exported CPython function locates the interpreter's module. */
    uintptr_t inside = (uintptr_t)&PyEval_EvalCode;
    for (const char *const *name = btc_py_eval_functions; *name && n_eval < MAX_EVAL_RANGES; name++)
        n_eval += btc_module_function_ranges(inside, *name, eval_lo + n_eval, eval_hi + n_eval,
                                             MAX_EVAL_RANGES - n_eval);
}

bool btc_in_eval_loop(uintptr_t pc)
{
    for (int i = 0; i < n_eval; i++)
        if (pc >= eval_lo[i] && pc < eval_hi[i])
            return true;
    return false;
}

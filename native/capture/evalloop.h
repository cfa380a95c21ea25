/* Which native pcs run the interpreter's eval loop (evalloop.c). */
#ifndef BTC_EVALLOOP_H
#define BTC_EVALLOOP_H

#include "common/base.h"

/* Find the eval loop's code ranges once (with the module lock held). */
void btc_eval_ranges_init(void);
/* Is pc (already adjusted for return addresses) in the eval loop? */
bool btc_in_eval_loop(uintptr_t pc);
/* For a pc in an unnamed part of the eval loop (a stripped interpreter):
 * the name an unstripped build gives that part ("_PyEval_EvalFrameDefault.cold")
 * and its start; NULL otherwise.  With the module lock held. */
const char *btc_eval_part_name(uintptr_t pc, uintptr_t *lo);

#endif

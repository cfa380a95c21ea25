/* Which native pcs run the interpreter's eval loop (evalloop.c). */
#ifndef BTC_EVALLOOP_H
#define BTC_EVALLOOP_H

#include "capture/cfi_lookup.h"
#include "common/base.h"

/* Find the eval loop's code ranges once (with the module lock held). */
void btc_eval_ranges_init(void);
/* How many ranges the eval loop has: -1 until btc_eval_ranges_init() ran
 * (the walker caches btc_in_eval_loop per pc and starts over when this
 * changes). */
int btc_eval_ranges_found(void);
/* Is pc (already adjusted for return addresses) in the eval loop? */
bool btc_in_eval_loop(uintptr_t pc);
/* For a pc in an unnamed part of the eval loop (a stripped interpreter):
 * the name an unstripped build gives that part ("_PyEval_EvalFrameDefault.cold")
 * and its start; NULL otherwise.  With the module lock held. */
const char *btc_eval_part_name(uintptr_t pc, uintptr_t *lo);

/* A named part of a function to scan for the parts its direct jumps land
 * in (see evalloop.c), in some address space: this process's, or another
 * process's module read from its file (remote/rmodules.c).  code[i] is the
 * byte at address lo + i; [span_lo, span_hi) is the module's code; address
 * - bias is what the module's CFI table is keyed by. */
typedef struct {
    const uint8_t *code;
    uintptr_t lo, hi, span_lo, span_hi, bias;
    const btc_table *table;
} btc_jump_scan;
/* Appends the parts found after the n ranges out_lo/out_hi hold (a part
 * already among them is not added again), up to max: the new count. */
int btc_jump_parts(const btc_jump_scan *scan, uintptr_t *out_lo, uintptr_t *out_hi, int n, int max);

#endif

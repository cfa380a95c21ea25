/* The one DWARF CFI walker, for every context (unwind.c). */
#ifndef BTC_UNWIND_H
#define BTC_UNWIND_H

#include "capture/context.h"

typedef struct {
    uintptr_t pc;    /* as found: return address, or exact pc */
    uint8_t exact;   /* pc is exact (innermost or interrupted by a signal) */
    uint8_t signal;  /* a signal return stub: pc is its first instruction, not after a call */
    uint8_t eval;    /* the interpreter's eval loop (btc_in_eval_loop), once its ranges are found;
                      * always 0 for another process's modules */
} btc_native_frame;

/* Walk from ctx; writes at most max frames.  Any failure (no CFI, a read
 * outside the view, no progress) ends the walk: a shorter backtrace, never a
 * crash.  Must be called with the module lock held (btc_modules_acquire). */
int btc_unwind(const btc_context *ctx, btc_native_frame *out, int max);

#endif

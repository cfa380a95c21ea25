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

/* What decided a walk, to prove it again without walking (a spawn site
 * seen before, docs/design.md "A site seen before"): every word its steps
 * read, with the value read, and whether a CFA was computed from the fp it
 * started with.  A walk from the same ip, sp (and fp, if used) over the
 * same view, with the same module list, that reads the same values in
 * those words is the same walk: each step's reads and result depend on
 * nothing else. */
#define BTC_WALK_PROOF_WORDS 96
typedef struct {
    int n;
    bool uses_fp;
    uint64_t modules;   /* the module list's generation, and whether the eval loop's ranges */
    int eval_ranges;    /* were known: the rows and eval flags the walk used */
    uintptr_t at[BTC_WALK_PROOF_WORDS], value[BTC_WALK_PROOF_WORDS];
} btc_walk_proof;

/* The proof of the walk of ctx that gave nat[0..n), made right after it
 * with the module lock still held: false when some step was not a plain
 * one (the rule interpreter reads more than a replay notes), or the walk
 * was not of this process's own stack (a view with a spill, another
 * process's modules). */
bool btc_unwind_proof(const btc_context *ctx, const btc_native_frame *nat, int n, btc_walk_proof *proof);
/* Do the proof's words still hold their values, with the same module
 * list?  Read in place, without the module lock, each only if it lies in
 * [lo, hi), the live stack the caller's walk would read (else false). */
bool btc_unwind_proven(const btc_walk_proof *proof, uintptr_t lo, uintptr_t hi);

#endif

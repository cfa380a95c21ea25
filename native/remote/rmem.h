/* Another process's memory (rmem.c): read through process_vm_readv (or
 * /proc/PID/mem), or from a core file's segments, with a bounded cache of
 * 4 KiB chunks.  What was read while the target was stopped stays as it
 * was: the cache is the dump's snapshot of the target. */
#ifndef BTC_RMEM_H
#define BTC_RMEM_H

#include "common/base.h"

/* btc_rmem and its API: btcore_api.h ("another process"). */

/* One aligned word, through the cache; false if unreadable. */
bool btc_rmem_word(btc_rmem *m, uintptr_t addr, uintptr_t *out);

/* Brent's cycle detection over a walk of links: a chain that comes back
 * to a link it passed is garbage (a corrupt target), found within about
 * twice the steps to the loop, with two words of state. */
typedef struct {
    uintptr_t mark;
    uint64_t steps, power;
} loop_watch;

static inline bool loops(loop_watch *w, uintptr_t at)
{
    if (at == w->mark)
        return true;
    if (++w->steps == w->power) {
        w->mark = at;
        w->power *= 2;
        w->steps = 0;
    }
    return false;
}

#endif

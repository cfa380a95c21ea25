/* A walk's starting point and its view of memory.
 *
 * The current thread, a suspended greenlet and (later) a signal handler or
 * another process differ only here: which registers the walk starts from,
 * which stack range may be read, and whether part of that range lives
 * elsewhere (greenlet copies the low part of a suspended stack to the heap).
 * The unwinder (unwind.c) is the same for all of them.
 */
#ifndef BTC_CONTEXT_H
#define BTC_CONTEXT_H

#include <pthread.h>

#include "capture/arch.h"
#include "common/base.h"

typedef struct btc_memview {
    uintptr_t lo, hi;              /* [lo, hi): the only stack addresses we read */
    uintptr_t spill_lo, spill_hi;  /* [spill_lo, spill_hi) is read from spill instead */
    const uint8_t *spill;
} btc_memview;

/* Where a walk finds the CFI row of a pc.  NULL in a context: this
 * process's modules (modules.c, through the walker's row cache); another
 * process's modules, loaded from their files, otherwise (native/remote/).
 * *in_module: whether any module covers pc (false ends the walk before the
 * frame is recorded: not a frame at all). */
typedef struct btc_row_source btc_row_source;
struct btc_row_source {
    const btc_cfi_row *(*find)(const btc_row_source *src, uintptr_t pc, bool *in_module);
};

typedef struct {
    btc_regs regs;
    bool ip_is_exact;    /* regs.ip is where execution stopped, not a return address */
    btc_memview mem;
    uintptr_t last_cfa;  /* frames whose CFA lies above this belong to someone else (0: no limit) */
    uintptr_t end_lo[2], end_hi[2];   /* the walk ends after a frame whose pc lies in one of these */
    int nend;
    const btc_row_source *rows;   /* NULL: this process's modules */
} btc_context;

/* Read one aligned 8-byte word of the stack; false if outside the view. */
static inline bool btc_mem_read(const btc_memview *m, uintptr_t addr, uintptr_t *out)
{
    if (BTC_UNLIKELY(addr & 7) || addr < m->lo || addr > m->hi - 8)
        return false;
    if (addr >= m->spill_lo && addr < m->spill_hi) {
        *out = *(const uintptr_t *)(m->spill + (addr - m->spill_lo));
        return true;
    }
    *out = *(const uintptr_t *)addr;
    return true;
}

/* The calling thread's stack range, cached per thread. */
bool btc_thread_stack(uintptr_t *lo, uintptr_t *hi);
/* The stack of a live thread (not cached: pthread_getattr_np reads
 * /proc/self/maps for the main thread). */
bool btc_pthread_stack(pthread_t thread, uintptr_t *lo, uintptr_t *hi);

/* [lo, hi) of the memory mapping containing addr (from /proc/self/maps). */
bool btc_mapping_bounds(uintptr_t addr, uintptr_t *lo, uintptr_t *hi);
/* The same, only if that mapping is readable; plain read() of
 * /proc/self/maps, so usable where no memory may be allocated. */
bool btc_mapping_readable(uintptr_t addr, uintptr_t *lo, uintptr_t *hi);
/* The end of the process's main-thread stack, if addr lies in it (learnt
 * once from /proc/self/maps: that stack never moves).  Async-signal-safe. */
bool btc_main_stack_end(uintptr_t addr, uintptr_t *hi);

#endif

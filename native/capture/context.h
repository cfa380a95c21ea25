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

#include <Python.h>

#include "common/btcore.h"

/* The registers the x86-64 walk tracks (DWARF numbers 16, 7, 6, 3). */
typedef struct {
    uintptr_t ip, sp, bp, bx;
} btc_regs;

typedef struct {
    uintptr_t lo, hi;              /* [lo, hi): the only stack addresses we read */
    uintptr_t spill_lo, spill_hi;  /* [spill_lo, spill_hi) is read from spill instead */
    const uint8_t *spill;
} btc_memview;

typedef struct {
    btc_regs regs;
    bool ip_is_exact;    /* regs.ip is where execution stopped, not a return address */
    btc_memview mem;
    uintptr_t last_cfa;  /* frames whose CFA lies above this belong to someone else (0: no limit) */
    uintptr_t end_lo[2], end_hi[2];   /* the walk ends after a frame whose pc lies in one of these */
    int nend;
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

/* Store the caller's registers: its pc (as a return address), sp, rbp, rbx.
 * The caller must stay on the stack while a walk uses them. */
void btc_get_regs(btc_regs *r);

/* [lo, hi) of the memory mapping containing addr (from /proc/self/maps). */
bool btc_mapping_bounds(uintptr_t addr, uintptr_t *lo, uintptr_t *hi);

/* ---- suspended greenlets (greenlet_context.c) ---- */

/* Fill ctx from a suspended greenlet's saved state (the GIL held). */
int btc_greenlet_context(PyObject *g, btc_context *ctx);
/* Where a walk of the calling thread's stack ends: in a greenlet other than
 * the thread's main one, after that greenlet's outermost own frame (its
 * start-up stub), found from greenlet's code alone: no layout check, no
 * greenlet switched.  Returns 1 in such a greenlet, 0 in a main greenlet (the
 * whole stack), or a BTC_E_* code. */
int btc_greenlet_current_end(btc_context *ctx);
/* What a collect() target is, for the builtin's fast path (GIL held):
 * UNKNOWN when it is not a greenlet or greenlet's layout is not learned yet
 * (the Python implementation then decides). */
enum { BTC_TARGET_UNKNOWN, BTC_TARGET_CURRENT, BTC_TARGET_THIS_THREAD, BTC_TARGET_OTHER_THREAD };
int btc_greenlet_target(PyObject *target);
/* Remember collect()'s greenlet target in a Backtrace, weakly, for format()'s
 * header (capture.c; GIL held). */
void btc_backtrace_remember_target(PyObject *bt, PyObject *target);
/* greenlet's own "started and not dead" (its C API, not g.__bool__, which
 * subclasses override): 1 or 0; -1 if g is not a greenlet (reason set). */
int btc_greenlet_active(PyObject *g);
/* g's gr_frame read through greenlet's own descriptor (new reference; None
 * when it has no Python frame); NULL with the reason set on failure.  Call
 * after btc_greenlet_active(). */
PyObject *btc_greenlet_frame(PyObject *g);
/* The calling thread's current greenlet (a new reference), NULL if greenlet
 * is not importable. */
PyObject *btc_current_greenlet(void);
/* Is pc in greenlet's own module (its switching machinery)? */
bool btc_greenlet_internal(uintptr_t pc);

/* ---- the walker (unwind.c) ---- */

typedef struct {
    uintptr_t pc;    /* as found: return address, or exact pc */
    uintptr_t cfa;   /* canonical frame address (the caller's sp) */
    uint8_t exact;   /* pc is exact (innermost or interrupted by a signal) */
} btc_native_frame;

/* Walk from ctx; writes at most max frames.  Any failure (no CFI, a read
 * outside the view, no progress) ends the walk: a shorter backtrace, never a
 * crash.  Must be called with the module lock held. */
int btc_unwind(const btc_context *ctx, btc_native_frame *out, int max);
/* Forget cached rows: their tables are about to be freed (module lock held). */
void btc_unwind_forget(void);

/* ---- spawn sites (capture.c, for spawn.c) ---- */

/* A raw capture into the caller's buffer (max entries). */
typedef struct {
    btc_frame *frames;
    int max, n;
    bool truncated;
} btc_raw_capture;

/* The calling thread's stack (in a greenlet, down to its outermost frame)
 * as seen from inside btcore's creation hook, walked from regs (taken by
 * btc_get_regs() in a frame that is still live): only btcore's own native
 * frames are dropped.  No references are taken: the code objects named are
 * those of frames running below the hook, alive until it returns.  0 or a
 * BTC_E_* code.  GIL held. */
int btc_capture_site(btc_raw_capture *c, int want, const btc_regs *regs);
/* A new btcore.Backtrace holding the capture (taking a reference to each
 * code object it names; codes: room for c->n), or NULL (no exception set). */
PyObject *btc_backtrace_from_site(const btc_raw_capture *c, PyObject **codes, int capacity);
/* Does the btcore.Backtrace bt hold exactly c's frames (and truncation)? */
bool btc_backtrace_holds(PyObject *bt, const btc_raw_capture *c);

#endif

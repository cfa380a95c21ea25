/* Suspended greenlets (greenlet_context.c): their saved context, and what
 * collect() needs to know about a greenlet target.  GIL held throughout. */
#ifndef BTC_GREENLET_CONTEXT_H
#define BTC_GREENLET_CONTEXT_H

#include <Python.h>

#include "capture/context.h"

/* Fill ctx from a suspended greenlet's saved state. */
int btc_greenlet_context(PyObject *g, btc_context *ctx);
/* Where a walk of the calling thread's stack ends: in a greenlet other than
 * the thread's main one, after that greenlet's outermost own frame (its
 * start-up stub), found from greenlet's code alone: no layout check, no
 * greenlet switched.  Returns 1 in such a greenlet, 0 in a main greenlet (the
 * whole stack), or a BTC_E_* code. */
int btc_greenlet_current_end(btc_context *ctx);
/* Learn greenlet's code (its start-up stub) now, with the GIL held, so that
 * btc_greenlet_stub_ends() can run where nothing may be looked up.  0 or a
 * BTC_E_* code. */
int btc_greenlet_learn_stub(void);
/* End a walk after greenlet's start-up stub, as learned (no lookup, no
 * allocation: usable in a signal handler).  Right whichever greenlet runs:
 * a main greenlet's stack holds no stub. */
void btc_greenlet_stub_ends(btc_context *ctx);
/* What a collect() target is, for the builtin's fast path: UNKNOWN when it
 * is not a greenlet or greenlet's layout is not learned yet (the Python
 * implementation then decides).  Which thread a greenlet of another is in
 * is not asked here: it matters only to one without a saved frame
 * (btc_greenlet_in_calling_thread), and asking cost a third of what
 * collect(g) spends outside the walk. */
enum { BTC_TARGET_UNKNOWN, BTC_TARGET_CURRENT, BTC_TARGET_GREENLET };
int btc_greenlet_target(PyObject *target);
/* Does greenlet g belong to the calling thread (the same root of the parent
 * chain as its current greenlet)?  1, 0, or -1 if greenlet is unusable. */
int btc_greenlet_in_calling_thread(PyObject *g);
/* The greenlet the thread of root (a main greenlet) runs now: 1 and its
 * address in *current (0 once the thread has ended), read from greenlet's
 * thread state (where its place was learned with the layout; GIL held: a
 * thread switches greenlets only with it); -1 when not learned (then
 * greenlet_objects.c's fallback rule applies).  Two loads, in place (see
 * greenlet_context.c for why that is safe with the GIL). */
int btc_greenlet_thread_current(PyObject *root, uintptr_t *current);
/* Has greenlet g (of greenlet_type, greenlet.greenlet) been made: has it its
 * C++ object yet?  greenlet's tp_new runs code while the object is already
 * in the gc's lists but has none: a collection (its instance dict's
 * allocation), and the finalizers of the greenlets other threads dropped
 * (their deleteme list, cleared when it borrows the current greenlet); a dump
 * run there finds it.  greenlet's own accessors (active, dead, __bool__) read
 * that object unchecked.  True too when greenlet's object layout is not
 * 3.x's (then nothing can tell). */
bool btc_greenlet_made(PyTypeObject *greenlet_type, PyObject *g);
/* greenlet's own "started and not dead" (its C API, not g.__bool__, which
 * subclasses override): 1 or 0 (0 too while g is being made); -1 if g is
 * not a greenlet (reason set). */
int btc_greenlet_active(PyObject *g);
/* g's gr_frame read through greenlet's own descriptor (new reference; None
 * when it has no Python frame); NULL with the reason set on failure.  Call
 * after btc_greenlet_active(). */
PyObject *btc_greenlet_frame(PyObject *g);
/* The calling thread's current greenlet (a new reference), NULL if greenlet
 * is not importable. */
PyObject *btc_current_greenlet(void);
/* Is pc in greenlet's stack switch (g_switchstack, as learned by
 * btc_greenlet_learn_stub)?  While it runs, the thread state's frame chain
 * belongs to neither greenlet: a signal handler must not read it. */
bool btc_greenlet_switching(uintptr_t pc);
/* [*lo, *hi): greenlet's own module (its switching machinery); empty
 * until greenlet's layout is learned. */
void btc_greenlet_internal_range(uintptr_t *lo, uintptr_t *hi);

/* A greenlet's outermost own frame (UserGreenlet::g_initialstub(void*)). */
#define BTC_GREENLET_INITIAL_STUB "_ZN8greenlet12UserGreenlet13g_initialstubEPv"

/* From a crash handler: the greenlet's StackState words (start, stop,
 * copy, saved), every read made with btc_read_own; false if g is not a
 * greenlet, or the layout is not learnt (greenlets.layout_known()). */
bool btc_greenlet_stack_state_own(uintptr_t g, uintptr_t state[4]);

#endif
